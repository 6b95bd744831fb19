//! QUIC transport settings for long fat links.
//!
//! A link can only be filled if the receiver lets the sender have a whole
//! bandwidth-delay product in flight: 10 Gbit/s at 50 ms RTT is 62.5 MB.
//! quinn's defaults (1.25 MB per stream, 10 MB per connection, about
//! 100 Mbit/s at 100 ms) would cap every probe far below such a link, so the
//! receive windows (connection and per stream) and the send buffer are all
//! sized to [`QuicTuning::target_bdp_bytes`]: one stream alone may use the
//! whole window, many streams share it. The windows are limits, not
//! allocations: memory is used only for data actually in flight.
//!
//! Keep-alives stop NATs and firewalls from forgetting an idle probe
//! connection, and the idle timeout ends a connection whose peer vanished.
//! Congestion control is quinn's default (CUBIC); every stream of one
//! connection shares its window.

use std::sync::Arc;
use std::time::Duration;

use quinn::{IdleTimeout, TransportConfig, VarInt};

use super::ProbeError;

/// Transport settings shared by probe clients and servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicTuning {
    /// The bandwidth-delay product to plan for; receive windows and the send
    /// buffer are this size. Default 64 MiB (about 10 Gbit/s at 50 ms).
    pub target_bdp_bytes: u64,
    /// Interval of keep-alive packets on an idle connection. Default 5 s.
    pub keep_alive_interval: Duration,
    /// A connection with no packet from the peer for this long is dropped.
    /// Default 30 s; must exceed `keep_alive_interval`.
    pub idle_timeout: Duration,
    /// Buffer for datagrams (pings, loss test) each way. Default 1 MiB.
    pub datagram_buffer_bytes: usize,
    /// The UDP socket's receive and send buffers (`SO_RCVBUF`/`SO_SNDBUF`,
    /// forced past `rmem_max` with `CAP_NET_ADMIN`; see [`crate::udp`]).
    /// Default 32 MiB: a burst of ~25 000 full-size datagrams, about 25 ms
    /// of a 10 Gbit/s link, so a reader that is late by that loses nothing
    /// in the kernel.
    pub socket_buffer_bytes: usize,
    /// The RTT a new connection assumes before it has measured one: the
    /// link's when known (the exchange sets it), else quinn's 333 ms.
    pub initial_rtt: Option<Duration>,
    /// Which congestion controller every connection runs.
    pub controller: QuicController,
}

/// The congestion controllers a connection can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuicController {
    /// quinn's default, Cubic.
    #[default]
    Cubic,
    /// quinn's NewReno (RFC 9002): halves its window on a loss, grows it
    /// by one packet a round trip.
    NewReno,
    /// quinn's BBR, which it marks experimental.
    Bbr,
    /// The dedicated-link controller ([`crate::congestion`]): a fixed
    /// target window per connection, bytes.
    Dedicated { window: u64 },
}

impl Default for QuicTuning {
    fn default() -> Self {
        Self {
            target_bdp_bytes: 64 << 20,
            keep_alive_interval: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            datagram_buffer_bytes: 1 << 20,
            socket_buffer_bytes: DEFAULT_SOCKET_BUFFER_BYTES,
            initial_rtt: None,
            controller: QuicController::Cubic,
        }
    }
}

/// Default UDP socket buffer of the agent's QUIC endpoints.
pub const DEFAULT_SOCKET_BUFFER_BYTES: usize = 32 << 20;
/// Accepted UDP socket buffers: the kernel's default at least, 1 GiB at most.
pub const SOCKET_BUFFER_RANGE: std::ops::RangeInclusive<usize> = (208 << 10)..=(1 << 30);

/// Smallest accepted window: below this even a LAN would be window-limited.
const MIN_BDP: u64 = 64 << 10;
/// Largest accepted window: 4 GiB is 100 Gbit/s at over 300 ms.
const MAX_BDP: u64 = 4 << 30;

impl QuicTuning {
    /// Checks the settings; errors name the field.
    pub fn validate(&self) -> Result<(), ProbeError> {
        let invalid = |field: &'static str, message: String| {
            Err(ProbeError::InvalidOptions { field, message })
        };
        if !(MIN_BDP..=MAX_BDP).contains(&self.target_bdp_bytes) {
            return invalid(
                "transport.target_bdp_bytes",
                format!(
                    "is {} bytes; it must be between {MIN_BDP} (64 KiB) and {MAX_BDP} (4 GiB)",
                    self.target_bdp_bytes
                ),
            );
        }
        if self.keep_alive_interval.is_zero() {
            return invalid(
                "transport.keep_alive_interval",
                "must be positive".to_string(),
            );
        }
        if self.idle_timeout <= self.keep_alive_interval {
            return invalid(
                "transport.idle_timeout",
                format!(
                    "is {:?}; it must exceed keep_alive_interval ({:?}) or idle connections die",
                    self.idle_timeout, self.keep_alive_interval
                ),
            );
        }
        if IdleTimeout::try_from(self.idle_timeout).is_err() {
            return invalid(
                "transport.idle_timeout",
                format!("{:?} is too long", self.idle_timeout),
            );
        }
        if !SOCKET_BUFFER_RANGE.contains(&self.socket_buffer_bytes) {
            return invalid(
                "transport.socket_buffer_bytes",
                format!(
                    "is {}; it must be between 208 KiB (the kernel's default) and 1 GiB",
                    self.socket_buffer_bytes
                ),
            );
        }
        if !(1500..=(64 << 20)).contains(&self.datagram_buffer_bytes) {
            return invalid(
                "transport.datagram_buffer_bytes",
                format!(
                    "is {}; it must be between 1500 and 64 MiB",
                    self.datagram_buffer_bytes
                ),
            );
        }
        if let Some(rtt) = self.initial_rtt
            && (rtt < Duration::from_micros(10) || rtt > Duration::from_secs(10))
        {
            return invalid(
                "transport.initial_rtt",
                format!("is {rtt:?}; it must be between 10 µs and 10 s"),
            );
        }
        Ok(())
    }

    /// The transport configuration; `peer_uni_streams` and `peer_bidi_streams`
    /// are how many streams of each kind the peer may open at once.
    pub(crate) fn transport_config(
        &self,
        peer_uni_streams: u32,
        peer_bidi_streams: u32,
    ) -> Result<Arc<TransportConfig>, ProbeError> {
        self.validate()?;
        let window =
            VarInt::from_u64(self.target_bdp_bytes).map_err(|_| ProbeError::InvalidOptions {
                field: "transport.target_bdp_bytes",
                message: "does not fit a QUIC integer".to_string(),
            })?;
        let idle =
            IdleTimeout::try_from(self.idle_timeout).map_err(|_| ProbeError::InvalidOptions {
                field: "transport.idle_timeout",
                message: format!("{:?} is too long", self.idle_timeout),
            })?;
        let mut config = TransportConfig::default();
        config
            .receive_window(window)
            .stream_receive_window(window)
            .send_window(self.target_bdp_bytes)
            .keep_alive_interval(Some(self.keep_alive_interval))
            .max_idle_timeout(Some(idle))
            .datagram_receive_buffer_size(Some(self.datagram_buffer_bytes))
            .datagram_send_buffer_size(self.datagram_buffer_bytes)
            .max_concurrent_uni_streams(VarInt::from_u32(peer_uni_streams))
            .max_concurrent_bidi_streams(VarInt::from_u32(peer_bidi_streams));
        if let Some(rtt) = self.initial_rtt {
            config.initial_rtt(rtt);
        }
        match self.controller {
            QuicController::Cubic => {}
            QuicController::NewReno => {
                config.congestion_controller_factory(Arc::new(
                    quinn::congestion::NewRenoConfig::default(),
                ));
            }
            QuicController::Bbr => {
                config.congestion_controller_factory(Arc::new(
                    quinn::congestion::BbrConfig::default(),
                ));
            }
            QuicController::Dedicated { window } => {
                config.congestion_controller_factory(Arc::new(
                    crate::congestion::DedicatedConfig { window },
                ));
            }
        }
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_the_field() {
        QuicTuning::default().validate().unwrap();
        let small = QuicTuning {
            target_bdp_bytes: 1000,
            ..QuicTuning::default()
        };
        let error = small.validate().unwrap_err().to_string();
        assert!(error.contains("transport.target_bdp_bytes"), "{error}");
        let idle = QuicTuning {
            idle_timeout: Duration::from_secs(1),
            ..QuicTuning::default()
        };
        let error = idle.validate().unwrap_err().to_string();
        assert!(error.contains("keep_alive_interval"), "{error}");
    }
}
