//! The bounds on what a request, a command or a config file may hold, in
//! one place, and the helpers that apply them.
//!
//! Every string and list a client, an agent or a peer can send has a bound
//! here, checked by the same validators the state machine's apply runs (so
//! a command the service accepts is a command every replica applies, and a
//! command it refuses never reaches the log). Errors quote at most a short
//! prefix of an offending value ([`quote`]), and a status message is never
//! longer than [`MAX_MESSAGE_BYTES`] ([`shorten`]): a client's metadata
//! limits are far smaller than the values it may have sent.

use crate::config::{FieldPath, Violation};

/// Ids: sites, buildings, domain groups, GPU types, jobs. The character set
/// is [`crate::config::check_id`]'s, which apply also runs (with its own
/// literal 63, the same).
pub const MAX_ID_LEN: usize = 63;
/// Free-form names: a topology's, a site's display name, a member's name.
pub const MAX_NAME_LEN: usize = 128;
/// A member's peer or client URL (`http[s]://host:port`).
pub const MAX_URL_LEN: usize = 512;
/// A site agent's data-plane address (`host:port`).
pub const MAX_ADDRESS_LEN: usize = 256;
/// A reason recorded with a state (a site marked down, an infeasible job).
pub const MAX_REASON_LEN: usize = 4096;
/// The longest inner step a site may report measuring (a day), in
/// microseconds.
pub const MAX_INNER_STEP_US: u64 = 86_400_000_000;
/// Sites in a topology, and entries of a job's `allowed_sites`.
pub const MAX_SITES: usize = 1024;
/// Coordinator replica URLs an agent's config may list.
pub const MAX_COORDINATOR_URLS: usize = 64;
/// Buildings of one site.
pub const MAX_BUILDINGS_PER_SITE: usize = 256;
/// Domain groups of one building (identical domains are one group, so this
/// bounds distinct kinds, not racks).
pub const MAX_GROUPS_PER_BUILDING: usize = 4096;
/// Changes in one inventory delta.
pub const MAX_INVENTORY_CHANGES: usize = 1024;
/// The opaque payload of a no-op command (benchmarks carry values in it).
pub const MAX_NOOP_PAYLOAD: usize = 1 << 20;
/// Fragments of one outer round (the sync planner picks at most a few
/// hundred; each costs two small commands per site).
pub const MAX_ROUND_FRAGMENTS: u32 = 4096;
/// A reduced fragment's hash as a site reports it (hex of a 256-bit digest
/// is 64 characters).
pub const MAX_HASH_LEN: usize = 128;
/// Kinds named in one watch request.
pub const MAX_WATCH_KINDS: usize = 16;
/// The largest request message the operator and agent APIs decode. The
/// largest legitimate one, a registration of a site's whole inventory at
/// the bounds above, is far smaller; 4 MiB is also gRPC's usual default.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
/// Scale-up domains in one domain group of a building.
pub const MAX_DOMAINS_PER_GROUP: u32 = 1_000_000;
/// Nodes in one scale-up domain (an NVL72 rack has 18).
pub const MAX_NODES_PER_DOMAIN: u32 = 4096;
/// GPUs in one node (8 in an HGX node, 4 in a GB200 tray).
pub const MAX_GPUS_PER_NODE: u32 = 64;
/// GPUs of a whole topology, or of one registered site: 100 times the
/// largest clusters built today, and far from the sums' `u64` overflow.
pub const MAX_GPUS: u64 = 10_000_000;
/// The Earth's equatorial circumference, in km.
pub const EARTH_CIRCUMFERENCE_KM: f64 = 40_075.0;
/// The longest fibre route a link may have: twice around the Earth. The
/// great circle between antipodes is half of one circumference; real
/// routes detour, but not by four times.
pub const MAX_ROUTE_KM: f64 = 2.0 * EARTH_CIRCUMFERENCE_KM;
/// WAN link entries of a topology (a full mesh of 362 sites).
pub const MAX_LINKS: usize = 65_536;
/// Parallel links one WAN link entry describes.
pub const MAX_PARALLEL_LINKS: u32 = 4096;
/// The fastest rate of one port, link or fabric: 1 Pbit/s (today's
/// fastest ports carry 1.6 Tbit/s, an NVLink 5 GPU 14.4 Tbit/s).
pub const MAX_RATE_BITS_PER_SECOND: u64 = 1_000_000_000_000_000;
/// A model's parameters: 10^15, ten times the largest any plan here could
/// hold (the memory check refuses far smaller ones on real topologies).
pub const MAX_PARAMETERS: u64 = 1_000_000_000_000_000;
/// A model's layers.
pub const MAX_LAYERS: u32 = 100_000;
/// A model's hidden size.
pub const MAX_HIDDEN_SIZE: u32 = 1 << 20;
/// Routed experts of one mixture-of-experts layer (DeepSeek-V3 has 256;
/// the placement search walks the divisors).
pub const MAX_EXPERTS: u32 = 1 << 16;
/// Sequences per optimizer step (the placement search walks the divisors).
pub const MAX_GLOBAL_BATCH: u32 = 1 << 24;
/// A model's sequence length, in tokens.
pub const MAX_SEQUENCE_LENGTH: u32 = 1 << 26;

/// Characters of an offending value an error quotes.
pub const MAX_QUOTED_CHARS: usize = 48;
/// Bytes of one error message, which travels in a response header.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `value` as an error quotes it: debug-quoted, at most
/// [`MAX_QUOTED_CHARS`] characters of it, and its length when cut.
pub fn quote(value: &str) -> String {
    let mut chars = value.char_indices();
    match chars.nth(MAX_QUOTED_CHARS) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &value[..cut], value.len()),
    }
}

/// `message` cut to at most [`MAX_MESSAGE_BYTES`] bytes at a character
/// boundary, saying that it was.
pub fn shorten(message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    const MARK: &str = "… (message cut)";
    let mut cut = MAX_MESSAGE_BYTES - MARK.len();
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{MARK}", &message[..cut])
}

/// A string of at most `max` bytes.
pub fn check_len(path: &FieldPath, value: &str, max: usize, out: &mut Vec<Violation>) {
    if value.len() > max {
        out.push(Violation::new(
            path.clone(),
            format!(
                "is {} bytes long, more than the {max} allowed: {}",
                value.len(),
                quote(value)
            ),
        ));
    }
}

/// A list of at most `max` entries of `what`.
pub fn check_entries(
    path: &FieldPath,
    len: usize,
    max: usize,
    what: &str,
    out: &mut Vec<Violation>,
) {
    if len > max {
        out.push(Violation::new(
            path.clone(),
            format!("holds {len} {what}, more than the {max} allowed"),
        ));
    }
}

/// A count of at most `max` `what` (`what` may be empty: a size without a unit).
pub fn check_at_most<T: PartialOrd + std::fmt::Display>(
    path: &FieldPath,
    value: T,
    max: T,
    what: &str,
    out: &mut Vec<Violation>,
) {
    if value > max {
        out.push(Violation::new(
            path.clone(),
            format!(
                "is {value}{}{what}, more than the {max} allowed",
                if what.is_empty() { "" } else { " " }
            ),
        ));
    }
}

/// A rate of at most [`MAX_RATE_BITS_PER_SECOND`].
pub fn check_rate_at_most(
    path: &FieldPath,
    rate: crate::units::DataRate,
    out: &mut Vec<Violation>,
) {
    let max = crate::units::DataRate::from_bits_per_second(MAX_RATE_BITS_PER_SECOND);
    if rate.bits_per_second() > max.bits_per_second() {
        out.push(Violation::new(
            path.clone(),
            format!("is {rate}, faster than the {max} allowed"),
        ));
    }
}

/// Why `url` cannot reach a replica, if it cannot: it must be
/// `http://host:port` or `https://host:port` (a trailing `/` allowed), the
/// host a DNS name, an IPv4 address or a bracketed IPv6 address, the port
/// 1 to 65535, and the whole at most [`MAX_URL_LEN`] bytes.
pub fn url_problem(url: &str) -> Option<String> {
    if url.len() > MAX_URL_LEN {
        return Some(format!(
            "is {} bytes long, more than the {MAX_URL_LEN} allowed",
            url.len()
        ));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(format!(
            "{} is not a URL: expected http://host:port or https://host:port",
            quote(url)
        ));
    };
    if scheme != "http" && scheme != "https" {
        return Some(format!(
            "scheme {} is not http or https (replicas speak gRPC over HTTP/2)",
            quote(scheme)
        ));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#', '@']) {
        return Some(format!(
            "{} has a path, query or user part; expected only host:port",
            quote(url)
        ));
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once("]:") {
            Some((host, port)) if host.parse::<std::net::Ipv6Addr>().is_ok() => (host, port),
            _ => {
                return Some(format!(
                    "{} has an IPv6 host that is not `[address]:port`",
                    quote(url)
                ));
            }
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, port),
            None => {
                return Some(format!("{} has no port: expected host:port", quote(url)));
            }
        },
    };
    if host.is_empty() {
        return Some(format!("{} has no host", quote(url)));
    }
    let dns_like = host.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if !authority.starts_with('[') && !dns_like {
        return Some(format!(
            "host {} is neither a DNS name nor an IPv4 address",
            quote(host)
        ));
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Some(format!(
            "port {} is not a port number from 1 to 65535",
            quote(port)
        )),
        Ok(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_value_is_quoted_by_a_short_prefix_and_its_length() {
        let long = "x".repeat(1 << 20);
        let quoted = quote(&long);
        assert!(quoted.len() < 80, "{quoted}");
        assert!(quoted.ends_with("… (1048576 bytes)"), "{quoted}");
        assert_eq!(quote("south"), "\"south\"");
        // Cut at a character, not inside one.
        let wide = "é".repeat(100);
        assert!(quote(&wide).contains(&"é".repeat(MAX_QUOTED_CHARS)));
    }

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let message = "é".repeat(4000);
        let short = shorten(message);
        assert!(short.len() <= MAX_MESSAGE_BYTES, "{}", short.len());
        assert!(short.ends_with("(message cut)"));
        assert_eq!(shorten("fine".into()), "fine");
    }

    #[test]
    fn urls_a_replica_can_be_reached_at_pass_and_others_say_why_not() {
        for good in [
            "http://10.0.0.1:2380",
            "https://coordinator-1.example.org:443/",
            "http://localhost:1",
            "http://[::1]:65535",
        ] {
            assert_eq!(url_problem(good), None, "{good}");
        }
        for (bad, why) in [
            ("ftp://10.0.0.1:2380", "scheme \"ftp\""),
            ("http://10.0.0.1:99999", "port \"99999\""),
            ("http://10.0.0.1:0", "port \"0\""),
            ("http://10.0.0.1", "no port"),
            ("10.0.0.1:2380", "not a URL"),
            ("http://:2380", "no host"),
            ("http://a b:2380", "neither a DNS name"),
            ("http://host:80/raft", "path"),
            ("http://user@host:80", "user part"),
            ("http://[::1:80", "IPv6"),
        ] {
            let problem = url_problem(bad).unwrap_or_else(|| panic!("{bad} passed"));
            assert!(problem.contains(why), "{bad}: {problem}");
        }
        let long = format!("http://{}:80", "a".repeat(MAX_URL_LEN));
        assert!(
            url_problem(&long)
                .unwrap()
                .contains("more than the 512 allowed")
        );
    }
}
