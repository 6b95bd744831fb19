//! Flows: a transfer between two sites, an outer round's fragment exchange.

use longhaul_core::rng::derive;
use longhaul_core::units::Duration;

use super::connection::{Connection, Control, Growth, WarmConnection};
use super::cubic::{Cubic, Flavour};
use super::engine::{Fabric, Payload, Step};
use super::{DesError, Limits, SenderModel, TcpParams};
use crate::link::{DropCounts, Link, LinkConfig};

/// The reverse direction's seed from the forward one, as
/// [`DuplexLink::symmetric`](crate::link::DuplexLink::symmetric) does.
const REVERSE_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// The mesh has sites² link directions; beyond this it would not fit in
/// memory or in a run of reasonable length.
const MAX_SITES: u32 = 256;

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every flow's receiver holds every byte.
    Completed,
    /// [`Limits::max_virtual_time`] was reached first.
    TimeLimit,
    /// [`Limits::max_events`] was reached first.
    EventLimit,
    /// Nothing was left to happen and some bytes never arrived.
    Stalled,
}

/// One flow of `bytes` from A to B over `connections` parallel connections.
#[derive(Debug, Clone, PartialEq)]
pub struct TransferConfig {
    /// The A→B direction, which carries the data.
    pub link: LinkConfig,
    /// The B→A direction, which carries the ACKs; `None` for the same
    /// configuration as `link`.
    pub reverse: Option<LinkConfig>,
    pub bytes: u64,
    pub connections: u32,
    pub sender: SenderModel,
    pub tcp: TcpParams,
    pub limits: Limits,
    /// A→B is seeded with it, B→A with `seed ^ 0x9E37_79B9_7F4A_7C15`.
    pub seed: u64,
    /// The connections as an earlier transfer left them, one per
    /// connection, from its [`TransferReport::warm`] (with the same
    /// `sender`): they go on from their window and RTT estimate rather than
    /// from the initial window in slow start. Empty: new connections.
    pub warm: Vec<WarmConnection>,
}

impl TransferConfig {
    /// Default segment sizes, timers and limits.
    pub fn new(
        link: LinkConfig,
        bytes: u64,
        connections: u32,
        sender: SenderModel,
        seed: u64,
    ) -> Self {
        Self {
            link,
            reverse: None,
            bytes,
            connections,
            sender,
            tcp: TcpParams::default(),
            limits: Limits::default(),
            seed,
            warm: Vec::new(),
        }
    }
}

/// What happened to a transfer.
#[derive(Debug, Clone, PartialEq)]
pub struct TransferReport {
    pub seed: u64,
    pub outcome: Outcome,
    /// When B held every byte.
    pub completion: Option<Duration>,
    /// Virtual time when the run stopped.
    pub elapsed: Duration,
    /// Payload bytes B holds.
    pub bytes_received: u64,
    /// `bytes_received / elapsed`, bytes per second.
    pub goodput_bytes_per_second: f64,
    /// Data packets sent, retransmissions included.
    pub packets_sent: u64,
    pub retransmits: u64,
    pub timeouts: u64,
    /// Drops of data packets on A→B, by cause.
    pub data_drops: DropCounts,
    /// Drops of ACKs on B→A, by cause.
    pub ack_drops: DropCounts,
    /// Largest egress backlog of A→B, bytes.
    pub queue_high_water_bytes: u64,
    /// Sends, deliveries and timer firings.
    pub events: u64,
    /// Each connection as the transfer left it, for the next transfer of
    /// connections kept open ([`TransferConfig::warm`]); empty unless the
    /// transfer completed.
    pub warm: Vec<WarmConnection>,
}

/// An outer round's fragment exchange among `sites` sites over a full mesh:
/// reduce-scatter, then all-gather; in each phase every ordered pair of
/// sites moves `fragment_bytes / sites` over `connections` connections.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeConfig {
    pub sites: u32,
    /// Every direction of the mesh.
    pub link: LinkConfig,
    /// The fragment every site holds, bytes.
    pub fragment_bytes: u64,
    /// Connections per ordered pair of sites.
    pub connections: u32,
    pub sender: SenderModel,
    pub tcp: TcpParams,
    pub limits: Limits,
    /// Direction `i->j` is seeded with `derive(seed, "i->j", 0)`.
    pub seed: u64,
}

impl ExchangeConfig {
    pub fn new(
        sites: u32,
        link: LinkConfig,
        fragment_bytes: u64,
        connections: u32,
        sender: SenderModel,
        seed: u64,
    ) -> Self {
        Self {
            sites,
            link,
            fragment_bytes,
            connections,
            sender,
            tcp: TcpParams::default(),
            limits: Limits::default(),
            seed,
        }
    }
}

/// What happened to a round.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeReport {
    pub seed: u64,
    pub outcome: Outcome,
    pub reduce_scatter: Option<Duration>,
    pub all_gather: Option<Duration>,
    /// Both phases.
    pub round: Option<Duration>,
    pub elapsed: Duration,
    pub packets_sent: u64,
    pub retransmits: u64,
    pub timeouts: u64,
    /// Drops on every link, data and ACKs.
    pub drops: DropCounts,
    pub events: u64,
}

/// One transfer. Bad configurations are refused with the field named.
pub fn transfer(config: &TransferConfig) -> Result<TransferReport, DesError> {
    config.tcp.validate()?;
    let forward = Link::new(config.link.clone(), config.seed).map_err(|source| DesError::Link {
        field: "link",
        source,
    })?;
    let reverse_config = config
        .reverse
        .clone()
        .unwrap_or_else(|| config.link.clone());
    let reverse =
        Link::new(reverse_config, config.seed ^ REVERSE_SEED).map_err(|source| DesError::Link {
            field: "reverse",
            source,
        })?;
    let mut run = Run::new(vec![forward, reverse], config.limits);
    let flow = FlowSpec {
        data_link: 0,
        ack_link: 1,
        bytes: config.bytes,
        connections: config.connections,
    };
    let plan = run.plan_flow(&flow, config.sender, &config.tcp, "bytes")?;
    if !config.warm.is_empty() {
        if config.warm.len() != plan.shares.len() {
            return Err(DesError::Warm {
                message: format!(
                    "{} connection state(s) for {} connection(s)",
                    config.warm.len(),
                    plan.shares.len()
                ),
            });
        }
        if let Some(other) = config.warm.iter().find(|w| w.sender != config.sender) {
            return Err(DesError::Warm {
                message: format!(
                    "a {:?} connection's state for a {:?} sender",
                    other.sender, config.sender
                ),
            });
        }
    }
    run.start_flows(vec![(flow, plan)], &config.tcp, &config.warm);
    let outcome = run.drive();

    let stats = run.fabric.link(0).stats();
    let bytes_received = run.connections.iter().map(Connection::received_bytes).sum();
    let elapsed = match run.completed.first() {
        Some(Some(at)) => *at,
        _ => run.fabric.now_ns(),
    };
    Ok(TransferReport {
        seed: config.seed,
        outcome,
        completion: run
            .completed
            .first()
            .copied()
            .flatten()
            .map(Duration::from_nanos),
        elapsed: Duration::from_nanos(elapsed),
        bytes_received,
        goodput_bytes_per_second: if elapsed > 0 {
            bytes_received as f64 / (elapsed as f64 * 1e-9)
        } else {
            0.0
        },
        packets_sent: run.connections.iter().map(|c| c.packets_sent).sum(),
        retransmits: run.connections.iter().map(|c| c.retransmits).sum(),
        timeouts: run.connections.iter().map(|c| c.timeouts).sum(),
        data_drops: stats.drops,
        ack_drops: run.fabric.link(1).stats().drops,
        queue_high_water_bytes: stats.queue_high_water_bytes,
        events: run.fabric.events,
        warm: if outcome == Outcome::Completed {
            run.connections
                .iter()
                .map(|c| c.warm(config.sender, elapsed))
                .collect()
        } else {
            Vec::new()
        },
    })
}

/// One outer round's fragment exchange.
pub fn exchange(config: &ExchangeConfig) -> Result<ExchangeReport, DesError> {
    config.tcp.validate()?;
    if config.sites < 2 {
        return Err(DesError::TooFewSites {
            found: config.sites,
        });
    }
    if config.sites > MAX_SITES {
        return Err(DesError::TooManySites {
            found: config.sites,
            max: MAX_SITES,
        });
    }
    if config.fragment_bytes == 0 {
        return Err(DesError::Zero {
            field: "fragment_bytes",
        });
    }
    let sites = config.sites as usize;
    // Direction i->j is link i·sites + j (the diagonal is unused but keeps
    // the indexing plain; it costs one idle link per site).
    let mut links = Vec::with_capacity(sites * sites);
    for from in 0..sites {
        for to in 0..sites {
            let seed = derive(config.seed, &format!("{from}->{to}"), 0);
            links.push(
                Link::new(config.link.clone(), seed).map_err(|source| DesError::Link {
                    field: "link",
                    source,
                })?,
            );
        }
    }
    let share = (config.fragment_bytes / u64::from(config.sites)).max(1);
    let mut pairs = Vec::new();
    for from in 0..sites {
        for to in 0..sites {
            if from != to {
                pairs.push(FlowSpec {
                    data_link: from * sites + to,
                    ack_link: to * sites + from,
                    bytes: share,
                    connections: config.connections,
                });
            }
        }
    }
    let mut run = Run::new(links, config.limits);
    let mut plans = Vec::with_capacity(pairs.len());
    for pair in &pairs {
        plans.push(run.plan_flow(pair, config.sender, &config.tcp, "fragment_bytes")?);
    }

    let mut phase_ends = Vec::new();
    let mut outcome = Outcome::Completed;
    for _phase in 0..2 {
        let started = run.fabric.now_ns();
        run.start_flows(
            pairs.iter().cloned().zip(plans.iter().cloned()).collect(),
            &config.tcp,
            &[],
        );
        outcome = run.drive();
        if outcome != Outcome::Completed {
            break;
        }
        let ended = run
            .completed
            .iter()
            .flatten()
            .copied()
            .max()
            .unwrap_or(started);
        phase_ends.push((started, ended));
    }
    let phase = |index: usize| {
        phase_ends
            .get(index)
            .map(|&(start, end)| Duration::from_nanos(end - start))
    };
    Ok(ExchangeReport {
        seed: config.seed,
        outcome,
        reduce_scatter: phase(0),
        all_gather: phase(1),
        round: (phase_ends.len() == 2).then(|| Duration::from_nanos(phase_ends[1].1)),
        elapsed: Duration::from_nanos(run.fabric.now_ns()),
        packets_sent: run.connections.iter().map(|c| c.packets_sent).sum(),
        retransmits: run.connections.iter().map(|c| c.retransmits).sum(),
        timeouts: run.connections.iter().map(|c| c.timeouts).sum(),
        drops: run.fabric.drops(),
        events: run.fabric.events,
    })
}

#[derive(Debug, Clone)]
struct FlowSpec {
    data_link: usize,
    ack_link: usize,
    bytes: u64,
    connections: u32,
}

/// Each connection's bytes and segments, and the sender it starts with.
#[derive(Debug, Clone)]
struct FlowPlan {
    shares: Vec<(u64, u32)>,
    control: Control,
}

/// The fabric, the connections and the flows of a run.
#[derive(Debug)]
struct Run {
    fabric: Fabric,
    connections: Vec<Connection>,
    limits: Limits,
    /// Per flow of the current phase: connections still receiving.
    remaining: Vec<u32>,
    /// Per flow of the current phase: when its receivers held every byte.
    completed: Vec<Option<u64>>,
    pending_flows: usize,
    /// Connections of earlier phases keep their indices; flows are numbered
    /// per phase from this offset.
    first_connection_of_phase: usize,
}

impl Run {
    fn new(links: Vec<Link>, limits: Limits) -> Self {
        Self {
            fabric: Fabric::new(links),
            connections: Vec::new(),
            limits,
            remaining: Vec::new(),
            completed: Vec::new(),
            pending_flows: 0,
            first_connection_of_phase: 0,
        }
    }

    fn plan_flow(
        &self,
        flow: &FlowSpec,
        sender: SenderModel,
        tcp: &TcpParams,
        bytes_field: &'static str,
    ) -> Result<FlowPlan, DesError> {
        if flow.connections == 0 {
            return Err(DesError::Zero {
                field: "connections",
            });
        }
        if flow.bytes == 0 {
            return Err(DesError::Zero { field: bytes_field });
        }
        // A connection moves at least one byte.
        let connections = u64::from(flow.connections).min(flow.bytes);
        let base = flow.bytes / connections;
        let extra = flow.bytes % connections;
        let mss = u64::from(tcp.mss_bytes);
        let max_segments = u64::from(u32::MAX - 1);
        let mut shares = Vec::with_capacity(connections as usize);
        for index in 0..connections {
            let bytes = base + u64::from(index < extra);
            let segments = bytes.div_ceil(mss);
            if segments > max_segments {
                return Err(DesError::TooManySegments {
                    field: bytes_field,
                    bytes: flow.bytes,
                    connections: flow.connections,
                    max: max_segments,
                });
            }
            shares.push((bytes, segments as u32));
        }
        let control = match sender {
            SenderModel::Reno => Connection::window(tcp, Growth::Reno),
            SenderModel::Cubic => {
                Connection::window(tcp, Growth::Cubic(Cubic::new(Flavour::Rfc9438)))
            }
            SenderModel::QuinnCubic => {
                Connection::window(tcp, Growth::Cubic(Cubic::new(Flavour::Quinn)))
            }
            SenderModel::Paced { bits_per_second } => {
                if bits_per_second == 0 {
                    return Err(DesError::Zero {
                        field: "sender.bits_per_second",
                    });
                }
                let bits =
                    u128::from(tcp.packet_bytes()) * 8 * 1_000_000_000 * u128::from(connections);
                let interval = bits.div_ceil(u128::from(bits_per_second));
                Control::Paced {
                    interval_ns: u64::try_from(interval).unwrap_or(u64::MAX).max(1),
                    next_send_ns: 0,
                }
            }
        };
        Ok(FlowPlan { shares, control })
    }

    /// Opens every flow's connections at the current virtual time, the
    /// first `warm.len()` of them from `warm`.
    fn start_flows(
        &mut self,
        flows: Vec<(FlowSpec, FlowPlan)>,
        tcp: &TcpParams,
        warm: &[WarmConnection],
    ) {
        self.first_connection_of_phase = self.connections.len();
        self.remaining = flows
            .iter()
            .map(|(_, plan)| plan.shares.len() as u32)
            .collect();
        self.completed = vec![None; flows.len()];
        self.pending_flows = flows.len();
        for (flow_index, (flow, plan)) in flows.into_iter().enumerate() {
            for (bytes, segments) in plan.shares {
                self.connections.push(Connection::new(
                    flow_index,
                    flow.data_link,
                    flow.ack_link,
                    bytes,
                    tcp,
                    plan.control.clone(),
                    segments,
                ));
            }
        }
        let now = self.fabric.now_ns();
        for (connection, warm) in self.connections[self.first_connection_of_phase..]
            .iter_mut()
            .zip(warm)
        {
            connection.resume(warm, now);
        }
        for index in self.first_connection_of_phase..self.connections.len() {
            self.connections[index].start(index as u32, &mut self.fabric);
        }
    }

    /// Runs until every flow of the phase is complete or a limit is hit.
    fn drive(&mut self) -> Outcome {
        let until = self.limits.max_virtual_time.as_nanos();
        loop {
            if self.pending_flows == 0 {
                return Outcome::Completed;
            }
            if self.fabric.events >= self.limits.max_events {
                return Outcome::EventLimit;
            }
            let connections = &self.connections;
            let Some(step) = self.fabric.next(until, |index, at| {
                connections[index as usize].timer_live(at)
            }) else {
                return if self.fabric.has_pending() {
                    Outcome::TimeLimit
                } else {
                    Outcome::Stalled
                };
            };
            match step {
                Step::Timer(index) => {
                    self.connections[index as usize].on_timer(index, &mut self.fabric);
                }
                Step::Arrival(arrival) => {
                    let index = arrival.connection;
                    let connection = &mut self.connections[index as usize];
                    match arrival.payload {
                        Payload::Data {
                            segment,
                            transmission,
                            sent_ns,
                        } => {
                            let was_complete = connection.completed_ns.is_some();
                            connection.on_data(
                                index,
                                segment,
                                transmission,
                                sent_ns,
                                &mut self.fabric,
                            );
                            if !was_complete
                                && connection.completed_ns.is_some()
                                && (index as usize) >= self.first_connection_of_phase
                            {
                                let flow = connection.flow;
                                self.remaining[flow] -= 1;
                                if self.remaining[flow] == 0 {
                                    self.completed[flow] = Some(self.fabric.now_ns());
                                    self.pending_flows -= 1;
                                }
                            }
                        }
                        Payload::Ack {
                            segment,
                            transmission,
                            echo_ns,
                            cumulative,
                        } => connection.on_ack(
                            index,
                            segment,
                            transmission,
                            echo_ns,
                            cumulative,
                            &mut self.fabric,
                        ),
                    }
                }
            }
        }
    }
}
