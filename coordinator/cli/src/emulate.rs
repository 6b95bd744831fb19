//! `longhaul emulate` (run the network emulator for a scenario) and
//! `longhaul emulator links|set|cut|heal` (its control API's client).

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::{Context as _, anyhow};
use clap::{Args, Subcommand};
use longhaul_core::units::{DataRate, Duration, human_rate};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::emulator_control_client::EmulatorControlClient;
use longhaul_simulations::emulator::{
    self, Emulator, EmulatorError, PacketEmulator, PacketOptions, human_ns,
};
use tonic::transport::Channel;

use super::table::{Table, thousands};
use super::{Failure, Output};

/// Where `emulate` serves the control API, and where `emulator` looks for it.
pub const DEFAULT_CONTROL: &str = "127.0.0.1:50070";

/// How real processes reach the emulated links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Loopback proxies per link; no privileges. TCP is relayed: the end
    /// hosts' TCP never sees a loss.
    Proxy,
    /// Every site in its own network namespace behind a TUN device; kernel
    /// TCP and QUIC run end to end. Linux, root (CAP_SYS_ADMIN and
    /// CAP_NET_ADMIN) and iproute2.
    Packet,
}

#[derive(Debug, Args)]
#[command(after_long_help = EMULATE_HELP)]
pub struct EmulateArgs {
    /// The scenario file: its topology's WAN links are emulated, with the
    /// scenario's impairments.
    pub scenario: PathBuf,
    /// `proxy`: loopback proxies for the services named by --expose, no
    /// privileges needed, TCP relayed. `packet`: each site in a network
    /// namespace with its own address, packets through the links end to
    /// end; needs root. See "Modes" below.
    #[arg(long, value_enum, default_value_t = Mode::Proxy)]
    pub mode: Mode,
    /// `--mode packet`: the sites' default TCP congestion control (reno,
    /// cubic, bbr: one the kernel offers); the host's default when omitted.
    #[arg(long, value_name = "NAME")]
    pub congestion_control: Option<String>,
    /// Where to serve the control API (`longhaul.v1.EmulatorControl`).
    #[arg(long, default_value = DEFAULT_CONTROL, env = "LONGHAUL_EMULATOR_CONTROL")]
    pub control: SocketAddr,
    /// Seed of every link's random number generator; the scenario's seed
    /// when omitted.
    #[arg(long)]
    pub seed: Option<u64>,
    /// `--mode proxy`: a service at a site, as SITE=ADDRESS (e.g.
    /// south=127.0.0.1:50051). For every other site with a link to SITE, a
    /// proxy is started that reaches ADDRESS through that link. Repeat for
    /// several services.
    #[arg(long, value_name = "SITE=ADDRESS", value_parser = parse_expose)]
    pub expose: Vec<(String, SocketAddr)>,
    /// The local address proxies listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub listen_host: IpAddr,
    /// Stop after this long (e.g. "30 s"); run until Ctrl-C when omitted.
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<Duration>,
    /// Serve Prometheus metrics here (`longhaul_emulator_drops_total{link,
    /// cause}`, cause one of queue, loss, down, kernel).
    #[arg(long, value_name = "ADDRESS")]
    pub metrics_listen: Option<SocketAddr>,
}

const EMULATE_HELP: &str = "\
Modes:
  --mode proxy (the default) needs no privileges: services are reached
  through loopback proxies (below). UDP is faithful; TCP is a relay, so the
  end hosts' TCP runs over loopback and never sees the link's loss, and one
  stream gets more than a real long link would give it.

  --mode packet gives every site its own network namespace (named
  lh-PID-RUN-SITE) with a TUN device holding the site's address,
  198.18.0.N/24, and routes to the other sites through it; every IP packet
  between sites goes through the link model. Kernel TCP and QUIC run end to
  end and see real loss, queues and RTT. Start processes in a site with
  `ip netns exec NAMESPACE COMMAND`; they reach other sites at their
  addresses. Needs Linux, root (CAP_SYS_ADMIN for the namespaces,
  CAP_NET_ADMIN for the TUN devices) and iproute2; without them the error
  names what is missing, and --mode proxy still works. The namespaces are
  removed when the emulator stops (Ctrl-C, SIGTERM, --duration).

How addresses map (proxy mode):
  Each WAN link of the topology becomes an emulated link with two directions
  (`a->b` and `b->a`), each with its own queue, loss and seed. For each
  `--expose SITE=ADDRESS` and each site FROM with a link to SITE, one local
  port is opened on --listen-host for both TCP and UDP. A client at FROM
  connects to that port; its packets go through FROM->SITE to ADDRESS, the
  replies through SITE->FROM. The address map printed at start lists every
  such port.

  UDP datagrams are packets (lost ones are gone). TCP streams are cut into
  1448-byte segments; a segment the link drops is retransmitted after
  max(RTT, 1 ms) (doubling, at most 200 ms), so TCP never loses bytes and
  a cut link stalls it until healed. The relay keeps at most what the link
  holds in flight (rate x one-way delay + buffer) and offers a segment only
  when the link's queue has room for it.

Examples:
  longhaul emulate deploy/scenarios/two-campuses-80km.toml \\
      --expose south=127.0.0.1:50051 --control 127.0.0.1:50070
  sudo longhaul emulate deploy/scenarios/two-campuses-80km.toml --mode packet
  sudo ip netns exec lh-PID-0-south iperf3 -s &
  sudo ip netns exec lh-PID-0-north iperf3 -c 198.18.0.2 -C reno
  longhaul emulator links
  longhaul emulator set north south --loss 0.01 --extra-delay '5 ms'
  longhaul emulator cut north        # every link of north
  longhaul emulator heal north";

#[derive(Debug, Subcommand)]
pub enum EmulatorCommand {
    /// List every link direction with its parameters and counters.
    Links(LinksArgs),
    /// Change a link's rate, loss or extra delay, from now on.
    Set(SetArgs),
    /// Cut the link between two sites, or every link of one site.
    Cut(CutArgs),
    /// Heal what `cut` cut.
    Heal(CutArgs),
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    /// The control API of a running `longhaul emulate`.
    #[arg(long, default_value = DEFAULT_CONTROL, env = "LONGHAUL_EMULATOR_CONTROL")]
    pub control: SocketAddr,
}

#[derive(Debug, Args)]
pub struct LinksArgs {
    #[command(flatten)]
    pub control: ControlArgs,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    #[command(flatten)]
    pub control: ControlArgs,
    /// One end of the link.
    pub site_a: String,
    /// The other end.
    pub site_b: String,
    /// Change only the direction from SITE_A to SITE_B.
    #[arg(long)]
    pub one_way: bool,
    /// New line rate, e.g. "20 Mbit/s".
    #[arg(long)]
    pub rate: Option<DataRate>,
    /// New Bernoulli loss probability in [0, 1); 0 turns loss off.
    #[arg(long)]
    pub loss: Option<f64>,
    /// One-way delay added to the link's configured delay, e.g. "20 ms".
    #[arg(long)]
    pub extra_delay: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct CutArgs {
    #[command(flatten)]
    pub control: ControlArgs,
    /// The site.
    pub site: String,
    /// Only the link to this site; every link of SITE when omitted.
    pub peer: Option<String>,
}

fn parse_expose(value: &str) -> Result<(String, SocketAddr), String> {
    let (site, address) = value
        .split_once('=')
        .ok_or_else(|| format!("expected SITE=ADDRESS, found {value:?}"))?;
    let address = address
        .parse()
        .map_err(|error| format!("{address:?} is not an IP:PORT address: {error}"))?;
    Ok((site.to_string(), address))
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?)
}

pub fn emulate(args: &EmulateArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let super::ScenarioFile {
        scenario, topology, ..
    } = super::load_scenario(&args.scenario)?;
    if args.mode == Mode::Packet && !args.expose.is_empty() {
        return Err(anyhow!(
            "--expose is for --mode proxy: in --mode packet, start each service in its \
             site's namespace (`ip netns exec NAMESPACE COMMAND`) and reach it at the \
             site's address"
        )
        .into());
    }
    if args.mode == Mode::Proxy && args.congestion_control.is_some() {
        return Err(anyhow!(
            "--congestion-control is for --mode packet: in --mode proxy, the end hosts' TCP \
             runs over loopback"
        )
        .into());
    }
    for (site, _) in &args.expose {
        if !topology.sites.iter().any(|s| &s.id == site) {
            return Err(anyhow!(
                "--expose {site}=...: topology {:?} has no site {site:?}",
                topology.name
            )
            .into());
        }
    }
    let seed = args.seed.unwrap_or(scenario.seed);
    let origin = if args.seed.is_some() {
        "--seed"
    } else {
        "the scenario"
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let specs = emulator::scenario_links(&topology, Some(&scenario));
    let runtime = runtime()?;
    runtime.block_on(async {
        if let Some(addr) = args.metrics_listen {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .with_http_listener(addr)
                .install()
                .with_context(|| format!("--metrics-listen: cannot serve metrics on {addr}"))?;
            emulator::metrics::describe();
        }
        let emulator = Emulator::new(seed, specs).context("cannot start the emulator")?;
        if args.metrics_listen.is_some() {
            let emulator = emulator.clone();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(std::time::Duration::from_secs(1));
                loop {
                    interval.tick().await;
                    emulator::metrics::record(&emulator.statuses());
                }
            });
        }
        writeln!(
            out,
            "emulating scenario {:?}: {} links, seed {seed} (from {origin})",
            scenario.name,
            emulator.site_pairs().len()
        )?;
        let mut links = Table::new(&[
            ("link", false),
            ("rate", true),
            ("one-way", true),
            ("jitter", true),
            ("loss", true),
            ("buffer", true),
            ("seed", true),
        ]);
        for status in emulator.statuses() {
            links.row(vec![
                status.id(),
                human_rate(status.rate_bits_per_second as f64),
                human_ns(status.one_way_ns),
                status.jitter_ns.map_or("-".to_string(), human_ns),
                format!("{}", status.loss),
                longhaul_core::units::human_bytes(status.buffer_bytes as f64),
                status.seed.to_string(),
            ]);
        }
        write!(out, "{}", links.render(2))?;

        // Dropped at the end, which removes the namespaces.
        let packet = match args.mode {
            Mode::Packet => Some(start_packet(&emulator, args, out)?),
            Mode::Proxy => None,
        };

        // Kept alive until the end: dropping a proxy stops it.
        let mut proxies = Vec::new();
        let mut map = Table::new(&[
            ("from site", false),
            ("connect to (tcp+udp)", false),
            ("reaches", false),
            ("via", false),
        ]);
        for (site, target) in &args.expose {
            for [a, b] in emulator.site_pairs() {
                let from = if &a == site {
                    b
                } else if &b == site {
                    a
                } else {
                    continue;
                };
                let (tcp, udp) = emulator
                    .expose(&from, site, args.listen_host, *target)
                    .await
                    .with_context(|| format!("cannot expose {site}={target} to {from}"))?;
                map.row(vec![
                    from.clone(),
                    tcp.local_addr().to_string(),
                    format!("{site} {target}"),
                    format!("{from}->{site}, back {site}->{from}"),
                ]);
                proxies.push((tcp, udp));
            }
        }
        if packet.is_some() {
            // The site table says how to reach everything.
        } else if proxies.is_empty() {
            writeln!(
                out,
                "no proxies: name a service with --expose SITE=ADDRESS (see --help)"
            )?;
        } else {
            writeln!(out, "address map:")?;
            write!(out, "{}", map.render(2))?;
        }

        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (address, server) = emulator::control::serve(emulator.clone(), args.control, async {
            let _ = stopped.await;
        })
        .await
        .context("cannot serve the control API")?;
        writeln!(
            out,
            "control API (longhaul.v1.EmulatorControl) on {address}; Ctrl-C stops"
        )?;
        out.flush()?;
        let server = tokio::spawn(server);
        match args.duration {
            Some(duration) => tokio::select! {
                () = tokio::time::sleep(duration.into()) => {}
                stopped = stop_signal() => stopped?,
            },
            None => stop_signal().await?,
        }
        let _ = stop.send(());
        let _ = server.await;
        drop(proxies);
        if let Some(packet) = packet {
            let unroutable = packet.unroutable_packets();
            // Blocking: stops the readers and runs `ip netns del`.
            tokio::task::block_in_place(|| drop(packet));
            writeln!(
                out,
                "namespaces removed; {unroutable} packets had no link to their address"
            )?;
        }
        writeln!(out, "stopped")?;
        Ok::<(), Failure>(())
    })
}

/// Starts the packet-level mode over `emulator` and prints the sites.
fn start_packet(
    emulator: &Emulator,
    args: &EmulateArgs,
    out: &mut dyn Write,
) -> Result<PacketEmulator, Failure> {
    let options = PacketOptions {
        congestion_control: args.congestion_control.clone(),
        ..PacketOptions::default()
    };
    let packet = tokio::task::block_in_place(|| PacketEmulator::start(emulator.clone(), &options))
        .map_err(|error| match error {
            EmulatorError::PacketModeUnavailable { .. } => {
                anyhow!("--mode packet: {error} (--mode proxy)")
            }
            EmulatorError::InvalidArgument {
                field: "congestion_control",
                ..
            } => anyhow!("--congestion-control: {error}"),
            error => anyhow::Error::new(error).context("--mode packet: cannot set up the sites"),
        })?;
    writeln!(
        out,
        "packet-level mode: every site in its own network namespace, packets between sites \
         through the links above"
    )?;
    let mut sites = Table::new(&[
        ("site", false),
        ("address", false),
        ("namespace", false),
        ("tcp congestion control", false),
    ]);
    let listed = packet.sites();
    for site in &listed {
        sites.row(vec![
            site.site.clone(),
            site.address.to_string(),
            site.namespace.clone(),
            site.congestion_control.clone(),
        ]);
    }
    write!(out, "{}", sites.render(2))?;
    if let [first, second, ..] = listed.as_slice() {
        writeln!(
            out,
            "run a process at a site with `ip netns exec NAMESPACE COMMAND`, e.g. \
             `ip netns exec {} iperf3 -s` and `ip netns exec {} iperf3 -c {}`",
            second.namespace, first.namespace, second.address
        )?;
    }
    Ok(packet)
}

/// Waits for Ctrl-C or, on Unix, SIGTERM: either stops the emulator
/// cleanly (proxies closed, namespaces removed), with or without
/// --duration.
pub(crate) async fn stop_signal() -> Result<(), Failure> {
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("cannot wait for SIGTERM")?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result.context("cannot wait for Ctrl-C")?,
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for Ctrl-C")?;
    Ok(())
}

async fn client(control: &ControlArgs) -> anyhow::Result<EmulatorControlClient<Channel>> {
    let endpoint = format!("http://{}", control.control);
    EmulatorControlClient::connect(endpoint)
        .await
        .with_context(|| {
            format!(
                "cannot reach the emulator's control API at {}",
                control.control
            )
        })
}

/// A gRPC error as the CLI reports it: the status message, with the code.
fn rpc_error(status: tonic::Status) -> Failure {
    anyhow!("{} ({:?})", status.message(), status.code()).into()
}

pub fn emulator(command: &EmulatorCommand, out: &mut dyn Write) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        match command {
            EmulatorCommand::Links(args) => {
                let response = client(&args.control)
                    .await?
                    .list_links(pb::EmulatorListLinksRequest {})
                    .await
                    .map_err(rpc_error)?
                    .into_inner();
                print_links(&response.links, response.seed, args.output, out)
            }
            EmulatorCommand::Set(args) => {
                let request = pb::EmulatorSetLinkRequest {
                    site_a: args.site_a.clone(),
                    site_b: args.site_b.clone(),
                    one_way: args.one_way,
                    rate_bits_per_second: args.rate.map(DataRate::bits_per_second),
                    loss: args.loss,
                    extra_delay_ns: args.extra_delay.map(Duration::as_nanos),
                };
                let response = client(&args.control)
                    .await?
                    .set_link(request)
                    .await
                    .map_err(rpc_error)?
                    .into_inner();
                for link in &response.links {
                    writeln!(
                        out,
                        "set {}: rate {}, one-way {}, loss {}",
                        link.id,
                        human_rate(link.rate_bits_per_second as f64),
                        human_ns(link.one_way_delay_ns),
                        link.loss
                    )?;
                }
                Ok(())
            }
            EmulatorCommand::Cut(args) => {
                let response = client(&args.control)
                    .await?
                    .cut(pb::EmulatorCutRequest {
                        site: args.site.clone(),
                        peer: args.peer.clone().unwrap_or_default(),
                    })
                    .await
                    .map_err(rpc_error)?
                    .into_inner();
                writeln!(out, "cut {}", response.link_ids.join(", "))?;
                Ok(())
            }
            EmulatorCommand::Heal(args) => {
                let response = client(&args.control)
                    .await?
                    .heal(pb::EmulatorHealRequest {
                        site: args.site.clone(),
                        peer: args.peer.clone().unwrap_or_default(),
                    })
                    .await
                    .map_err(rpc_error)?
                    .into_inner();
                writeln!(out, "healed {}", response.link_ids.join(", "))?;
                Ok(())
            }
        }
    })
}

fn print_links(
    links: &[pb::EmulatorLinkDirectionStatus],
    seed: u64,
    output: Output,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    if output == Output::Json {
        let links: Vec<_> = links
            .iter()
            .map(|l| {
                let drops = l.drops.unwrap_or_default();
                let lateness = l.release_lateness.unwrap_or_default();
                serde_json::json!({
                    "id": l.id, "from": l.from_site, "to": l.to_site, "seed": l.seed,
                    "rate_bits_per_second": l.rate_bits_per_second,
                    "one_way_delay_ns": l.one_way_delay_ns, "extra_delay_ns": l.extra_delay_ns,
                    "jitter_max_ns": l.jitter_max_ns,
                    "loss": l.loss, "buffer_bytes": l.buffer_bytes, "down": l.down,
                    "packets_in": l.packets_in, "bytes_in": l.bytes_in,
                    "packets_delivered": l.packets_delivered, "bytes_delivered": l.bytes_delivered,
                    "drops": {"queue": drops.queue, "loss": drops.loss, "down": drops.down,
                              "trace": drops.trace, "host": drops.host, "kernel": drops.kernel},
                    "queue_high_water_bytes": l.queue_high_water_bytes,
                    "retransmissions": l.retransmissions,
                    "release_lateness_us": {"samples": lateness.samples, "p50": lateness.p50_us,
                                            "p99": lateness.p99_us, "max": lateness.max_us},
                })
            })
            .collect();
        return super::print_json(&serde_json::json!({ "seed": seed, "links": links }), out);
    }
    writeln!(out, "seed {seed}")?;
    let mut table = Table::new(&[
        ("link", false),
        ("state", false),
        ("rate", true),
        ("one-way", true),
        ("jitter", true),
        ("loss", true),
        ("packets in", true),
        ("delivered", true),
        ("drops q/loss/down/host/kernel", true),
        ("retx", true),
        ("queue max", true),
        ("late p50/p99/max µs", true),
    ]);
    for l in links {
        let drops = l.drops.unwrap_or_default();
        let lateness = l.release_lateness.unwrap_or_default();
        table.row(vec![
            l.id.clone(),
            if l.down { "cut" } else { "up" }.to_string(),
            human_rate(l.rate_bits_per_second as f64),
            human_ns(l.one_way_delay_ns),
            if l.jitter_max_ns == 0 {
                "-".to_string()
            } else {
                human_ns(l.jitter_max_ns)
            },
            format!("{}", l.loss),
            thousands(l.packets_in),
            thousands(l.packets_delivered),
            format!(
                "{}/{}/{}/{}/{}",
                drops.queue + drops.trace,
                drops.loss,
                drops.down,
                drops.host,
                drops.kernel
            ),
            thousands(l.retransmissions),
            longhaul_core::units::human_bytes(l.queue_high_water_bytes as f64),
            format!(
                "{}/{}/{}",
                lateness.p50_us, lateness.p99_us, lateness.max_us
            ),
        ]);
    }
    write!(out, "{}", table.render(2))?;
    let host_dropped: u64 = links
        .iter()
        .map(|l| l.drops.map_or(0, |d| d.kernel + d.host))
        .sum();
    if host_dropped > 0 {
        writeln!(
            out,
            "warning: {host_dropped} datagram(s) dropped by this host, not by the link model \
             (kernel socket buffers or failed sends): losses the scenario did not configure"
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, run};

    fn longhaul(args: &[&str]) -> (u8, String, String) {
        let cli = Cli::try_parse_from(std::iter::once("longhaul").chain(args.iter().copied()))
            .expect("arguments parse");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let status = run(cli, &mut out, &mut err);
        (
            status,
            String::from_utf8(out).expect("utf-8"),
            String::from_utf8(err).expect("utf-8"),
        )
    }

    fn scenario() -> String {
        format!(
            "{}/../../deploy/scenarios/two-campuses-80km.toml",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    #[test]
    fn help_explains_the_address_map() {
        let help = Cli::try_parse_from(["longhaul", "emulate", "--help"])
            .expect_err("help is an early exit")
            .to_string();
        for needle in [
            "--expose",
            "--seed",
            "--control",
            "How addresses map",
            "retransmitted",
            "--mode packet",
            "TCP is a relay",
            "CAP_NET_ADMIN",
        ] {
            assert!(help.contains(needle), "{needle}: {help}");
        }
        let help = Cli::try_parse_from(["longhaul", "emulator", "--help"])
            .expect_err("help is an early exit")
            .to_string();
        for needle in ["links", "set", "cut", "heal"] {
            assert!(help.contains(needle), "{needle}: {help}");
        }
    }

    #[test]
    fn expose_must_be_site_equals_address() {
        assert_eq!(
            parse_expose("south=127.0.0.1:50051"),
            Ok((
                "south".to_string(),
                "127.0.0.1:50051".parse().expect("address")
            ))
        );
        assert!(parse_expose("south").is_err());
        let error = parse_expose("south=localhost").expect_err("not an IP address");
        assert!(error.contains("\"localhost\""), "{error}");
    }

    #[test]
    fn emulate_prints_the_seed_and_address_map_and_stops_after_its_duration() {
        let (status, out, err) = longhaul(&[
            "emulate",
            &scenario(),
            "--control",
            "127.0.0.1:0",
            "--seed",
            "99",
            "--expose",
            "south=127.0.0.1:9",
            "--duration",
            "200 ms",
        ]);
        assert_eq!(status, 0, "{err}");
        assert!(out.contains("seed 99 (from --seed)"), "{out}");
        assert!(out.contains("north->south"), "{out}");
        assert!(out.contains("address map:"), "{out}");
        assert!(out.contains("south 127.0.0.1:9"), "{out}");
        assert!(out.trim_end().ends_with("stopped"), "{out}");
    }

    #[test]
    fn packet_mode_takes_no_expose_and_proxy_mode_no_congestion_control() {
        let (status, _, err) = longhaul(&[
            "emulate",
            &scenario(),
            "--mode",
            "packet",
            "--expose",
            "south=127.0.0.1:9",
        ]);
        assert_eq!(status, 1);
        assert!(err.contains("--expose is for --mode proxy"), "{err}");
        let (status, _, err) = longhaul(&["emulate", &scenario(), "--congestion-control", "reno"]);
        assert_eq!(status, 1);
        assert!(
            err.contains("--congestion-control is for --mode packet"),
            "{err}"
        );
    }

    /// As root: the sites' namespaces exist while it runs and are gone
    /// after. Elsewhere: the error names what is missing.
    #[test]
    fn packet_mode_prints_the_sites_and_removes_their_namespaces() {
        let (status, out, err) = longhaul(&[
            "emulate",
            &scenario(),
            "--mode",
            "packet",
            "--congestion-control",
            "reno",
            "--control",
            "127.0.0.1:0",
            "--duration",
            "300 ms",
        ]);
        if status != 0 && err.contains("cannot run here: missing") {
            assert!(err.contains("--mode proxy"), "{err}");
            println!("skipped the packet-level part: {err}");
            return;
        }
        assert_eq!(status, 0, "{err}");
        assert!(out.contains("198.18.0.1"), "{out}");
        assert!(out.contains("198.18.0.2"), "{out}");
        assert!(out.contains("reno"), "{out}");
        assert!(out.trim_end().ends_with("stopped"), "{out}");
        let namespaces: Vec<&str> = out
            .split_whitespace()
            .filter(|word| word.starts_with("lh-") && !word.contains("PID"))
            .collect();
        assert!(namespaces.len() >= 2, "{out}");
        for name in namespaces {
            let name = name.trim_matches('`');
            assert!(
                !std::path::Path::new("/run/netns").join(name).exists(),
                "{name} left behind"
            );
        }
    }

    #[test]
    fn exposing_an_unknown_site_is_refused() {
        let (status, _, err) = longhaul(&[
            "emulate",
            &scenario(),
            "--control",
            "127.0.0.1:0",
            "--expose",
            "mars=127.0.0.1:9",
        ]);
        assert_eq!(status, 1);
        assert!(err.contains("no site \"mars\""), "{err}");
    }
}
