//! Quantities with units, as written in config files.
//!
//! Every physical figure in a config file is a string with an explicit unit
//! (`"80 km"`, `"400 Gbit/s"`, `"80 GiB"`, `"20 us"`, `"989 TFLOP/s"`), so a
//! reader never has to guess whether a number is bits or bytes, metres or
//! kilometres. A value written with the wrong kind of unit is rejected with a
//! message that says what was expected. Each type serializes to a canonical
//! string that parses back to exactly the same value.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a quantity string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("expected {expected} such as {example:?}, found {found:?}")]
    Malformed {
        expected: &'static str,
        example: &'static str,
        found: String,
    },
    #[error(
        "expected {expected} such as {example:?}, found unit {unit:?} which measures {measures}"
    )]
    WrongKind {
        expected: &'static str,
        example: &'static str,
        unit: String,
        measures: &'static str,
    },
    #[error("{expected} must not be negative, found {found:?}")]
    Negative {
        expected: &'static str,
        found: String,
    },
    #[error("{expected} {found:?} is not a whole number of {base}")]
    Fractional {
        expected: &'static str,
        found: String,
        base: &'static str,
    },
    #[error("{expected} {found:?} is too large")]
    Overflow {
        expected: &'static str,
        found: String,
    },
}

/// What each known unit symbol measures, for "wrong kind of unit" messages.
fn unit_kind(unit: &str) -> Option<&'static str> {
    if DataRate::scale(unit).is_some() {
        Some("a data rate")
    } else if ByteSize::scale(unit).is_some() {
        Some("a size in bytes")
    } else if Distance::scale(unit).is_some() {
        Some("a distance")
    } else if Duration::scale(unit).is_some() {
        Some("a duration")
    } else if Throughput::scale(unit).is_some() {
        Some("a compute throughput")
    } else {
        None
    }
}

/// Splits `"400 Gbit/s"` into `(400.0, "Gbit/s")`.
fn split_quantity<'a>(
    text: &'a str,
    expected: &'static str,
    example: &'static str,
) -> Result<(f64, &'a str), UnitError> {
    let trimmed = text.trim();
    let split_at = trimmed
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E' | '_')))
        .unwrap_or(trimmed.len());
    // An exponent marker glued to a unit ("5 EB") is not part of the number; the
    // number must still parse on its own.
    let (number, unit) = trimmed.split_at(split_at);
    let malformed = || UnitError::Malformed {
        expected,
        example,
        found: text.to_string(),
    };
    let value: f64 = number.replace('_', "").parse().map_err(|_| malformed())?;
    if !value.is_finite() {
        return Err(malformed());
    }
    let unit = unit.trim();
    if unit.is_empty() {
        return Err(malformed());
    }
    if value < 0.0 {
        return Err(UnitError::Negative {
            expected,
            found: text.to_string(),
        });
    }
    Ok((value, unit))
}

fn wrong_or_malformed(
    text: &str,
    unit: &str,
    expected: &'static str,
    example: &'static str,
) -> UnitError {
    match unit_kind(unit) {
        Some(measures) => UnitError::WrongKind {
            expected,
            example,
            unit: unit.to_string(),
            measures,
        },
        None => UnitError::Malformed {
            expected,
            example,
            found: text.to_string(),
        },
    }
}

/// Converts `value × scale` to an integer, refusing fractions of the base unit.
/// Whole numbers are converted in integer arithmetic, so values beyond 2^53
/// (which an `f64` cannot hold exactly) survive a print-and-parse round trip.
fn to_integer(
    value: f64,
    scale: f64,
    text: &str,
    expected: &'static str,
    base: &'static str,
) -> Result<u64, UnitError> {
    let digits: String = text
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '_')
        .collect();
    let digits = digits.replace('_', "");
    let rest = text
        .trim()
        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '_');
    let whole_number = !digits.is_empty() && !rest.starts_with(['.', 'e', 'E']);
    if whole_number && scale.fract() == 0.0 && scale >= 1.0 {
        let overflow = || UnitError::Overflow {
            expected,
            found: text.to_string(),
        };
        let number: u64 = digits.parse().map_err(|_| overflow())?;
        return number.checked_mul(scale as u64).ok_or_else(overflow);
    }
    let scaled = value * scale;
    if scaled > u64::MAX as f64 / 2.0 {
        return Err(UnitError::Overflow {
            expected,
            found: text.to_string(),
        });
    }
    let rounded = scaled.round();
    // Decimal input such as "1.1 Gbit/s" is off by a few ulps after scaling;
    // anything closer than a millionth of the base unit is that, not a fraction.
    if (scaled - rounded).abs() > 1e-6 * scaled.max(1.0) && (scaled - rounded).abs() > 1e-3 {
        return Err(UnitError::Fractional {
            expected,
            found: text.to_string(),
            base,
        });
    }
    Ok(rounded as u64)
}

/// Writes `base` in the largest unit of `units` that represents it exactly.
fn format_exact(f: &mut fmt::Formatter<'_>, base: u64, units: &[(&str, u64)]) -> fmt::Result {
    for &(symbol, scale) in units {
        if base != 0 && base.is_multiple_of(scale) {
            return write!(f, "{} {}", base / scale, symbol);
        }
    }
    let (symbol, _) = units[units.len() - 1];
    write!(f, "{base} {symbol}")
}

macro_rules! string_serde {
    ($ty:ty, $expecting:literal) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct QuantityVisitor;
                impl Visitor<'_> for QuantityVisitor {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                        v.parse().map_err(E::custom)
                    }
                }
                deserializer.deserialize_str(QuantityVisitor)
            }
        }
    };
}

/// A data rate in bits per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DataRate(u64);

impl DataRate {
    const EXPECTED: &'static str = "a data rate";
    const EXAMPLE: &'static str = "400 Gbit/s";

    pub const fn from_bits_per_second(bps: u64) -> Self {
        Self(bps)
    }
    pub const fn from_gbit_per_second(gbps: u64) -> Self {
        Self(gbps * 1_000_000_000)
    }
    pub const fn bits_per_second(self) -> u64 {
        self.0
    }
    pub fn bytes_per_second(self) -> f64 {
        self.0 as f64 / 8.0
    }

    fn scale(unit: &str) -> Option<f64> {
        Some(match unit {
            "bit/s" | "bps" => 1.0,
            "kbit/s" | "kbps" | "Kbps" => 1e3,
            "Mbit/s" | "Mbps" => 1e6,
            "Gbit/s" | "Gbps" => 1e9,
            "Tbit/s" | "Tbps" => 1e12,
            "B/s" => 8.0,
            "kB/s" | "KB/s" => 8e3,
            "MB/s" => 8e6,
            "GB/s" => 8e9,
            "TB/s" => 8e12,
            "KiB/s" => 8.0 * 1024.0,
            "MiB/s" => 8.0 * 1024.0 * 1024.0,
            "GiB/s" => 8.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return None,
        })
    }
}

impl std::str::FromStr for DataRate {
    type Err = UnitError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (value, unit) = split_quantity(text, Self::EXPECTED, Self::EXAMPLE)?;
        let scale = Self::scale(unit)
            .ok_or_else(|| wrong_or_malformed(text, unit, Self::EXPECTED, Self::EXAMPLE))?;
        to_integer(value, scale, text, Self::EXPECTED, "bit/s").map(Self)
    }
}

impl fmt::Display for DataRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        format_exact(
            f,
            self.0,
            &[
                ("Tbit/s", 1_000_000_000_000),
                ("Gbit/s", 1_000_000_000),
                ("Mbit/s", 1_000_000),
                ("kbit/s", 1_000),
                ("bit/s", 1),
            ],
        )
    }
}
string_serde!(DataRate, "a data rate string such as \"400 Gbit/s\"");

/// A size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(u64);

impl ByteSize {
    const EXPECTED: &'static str = "a size in bytes";
    const EXAMPLE: &'static str = "80 GiB";

    pub const fn from_bytes(bytes: u64) -> Self {
        Self(bytes)
    }
    pub const fn from_gib(gib: u64) -> Self {
        Self(gib << 30)
    }
    pub const fn bytes(self) -> u64 {
        self.0
    }

    fn scale(unit: &str) -> Option<f64> {
        Some(match unit {
            "B" => 1.0,
            "kB" | "KB" => 1e3,
            "MB" => 1e6,
            "GB" => 1e9,
            "TB" => 1e12,
            "KiB" => 1024.0,
            "MiB" => 1024.0 * 1024.0,
            "GiB" => 1024.0 * 1024.0 * 1024.0,
            "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return None,
        })
    }
}

impl std::str::FromStr for ByteSize {
    type Err = UnitError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (value, unit) = split_quantity(text, Self::EXPECTED, Self::EXAMPLE)?;
        let scale = Self::scale(unit)
            .ok_or_else(|| wrong_or_malformed(text, unit, Self::EXPECTED, Self::EXAMPLE))?;
        to_integer(value, scale, text, Self::EXPECTED, "bytes").map(Self)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        format_exact(
            f,
            self.0,
            &[
                ("TiB", 1 << 40),
                ("GiB", 1 << 30),
                ("MiB", 1 << 20),
                ("KiB", 1 << 10),
                ("TB", 1_000_000_000_000),
                ("GB", 1_000_000_000),
                ("MB", 1_000_000),
                ("kB", 1_000),
                ("B", 1),
            ],
        )
    }
}
string_serde!(ByteSize, "a size string such as \"80 GiB\"");

/// A duration in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(u64);

/// The same span as the standard library's type (exact: both count
/// nanoseconds).
impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        std::time::Duration::from_nanos(d.as_nanos())
    }
}

impl Duration {
    const EXPECTED: &'static str = "a duration";
    const EXAMPLE: &'static str = "20 us";

    pub const fn from_nanos(ns: u64) -> Self {
        Self(ns)
    }
    pub const fn from_micros(us: u64) -> Self {
        Self(us * 1_000)
    }
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms * 1_000_000)
    }
    pub const fn from_secs(s: u64) -> Self {
        Self(s * 1_000_000_000)
    }
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 * 1e-9
    }

    fn scale(unit: &str) -> Option<f64> {
        Some(match unit {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "min" => 60e9,
            "h" => 3600e9,
            _ => return None,
        })
    }
}

impl std::str::FromStr for Duration {
    type Err = UnitError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (value, unit) = split_quantity(text, Self::EXPECTED, Self::EXAMPLE)?;
        let scale = Self::scale(unit)
            .ok_or_else(|| wrong_or_malformed(text, unit, Self::EXPECTED, Self::EXAMPLE))?;
        to_integer(value, scale, text, Self::EXPECTED, "nanoseconds").map(Self)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        format_exact(
            f,
            self.0,
            &[
                ("s", 1_000_000_000),
                ("ms", 1_000_000),
                ("us", 1_000),
                ("ns", 1),
            ],
        )
    }
}
string_serde!(Duration, "a duration string such as \"20 us\"");

/// A distance, kept in kilometres as written (fibre routes are rarely whole
/// kilometres, and a float written by `Display` parses back bit-exactly).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub struct Distance(f64);

impl Distance {
    const EXPECTED: &'static str = "a distance";
    const EXAMPLE: &'static str = "80 km";

    /// Builds a distance; `None` for negative, NaN or infinite input.
    pub fn from_km(km: f64) -> Option<Self> {
        (km.is_finite() && km >= 0.0).then_some(Self(km))
    }
    pub const fn km(self) -> f64 {
        self.0
    }

    fn scale(unit: &str) -> Option<f64> {
        Some(match unit {
            "km" => 1.0,
            "m" => 1e-3,
            _ => return None,
        })
    }
}

impl std::str::FromStr for Distance {
    type Err = UnitError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (value, unit) = split_quantity(text, Self::EXPECTED, Self::EXAMPLE)?;
        let scale = Self::scale(unit)
            .ok_or_else(|| wrong_or_malformed(text, unit, Self::EXPECTED, Self::EXAMPLE))?;
        Ok(Self(value * scale))
    }
}

impl fmt::Display for Distance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} km", self.0)
    }
}
string_serde!(Distance, "a distance string such as \"80 km\"");

/// Compute throughput, kept in TFLOP/s as written.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub struct Throughput(f64);

impl Throughput {
    const EXPECTED: &'static str = "a compute throughput";
    const EXAMPLE: &'static str = "989 TFLOP/s";

    pub fn from_tflops(tflops: f64) -> Option<Self> {
        (tflops.is_finite() && tflops >= 0.0).then_some(Self(tflops))
    }
    pub const fn tflops(self) -> f64 {
        self.0
    }
    pub fn flops(self) -> f64 {
        self.0 * 1e12
    }

    fn scale(unit: &str) -> Option<f64> {
        Some(match unit {
            "GFLOP/s" => 1e-3,
            "TFLOP/s" => 1.0,
            "PFLOP/s" => 1e3,
            _ => return None,
        })
    }
}

impl std::str::FromStr for Throughput {
    type Err = UnitError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (value, unit) = split_quantity(text, Self::EXPECTED, Self::EXAMPLE)?;
        let scale = Self::scale(unit)
            .ok_or_else(|| wrong_or_malformed(text, unit, Self::EXPECTED, Self::EXAMPLE))?;
        Ok(Self(value * scale))
    }
}

impl fmt::Display for Throughput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} TFLOP/s", self.0)
    }
}
string_serde!(Throughput, "a throughput string such as \"989 TFLOP/s\"");

/// Formats a byte count for people: three significant figures, binary units.
pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{} {}", three_figures(value), UNITS[unit])
}

/// Formats a rate in bits per second for people, in decimal units.
pub fn human_rate(bits_per_second: f64) -> String {
    const UNITS: [&str; 6] = ["bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s", "Pbit/s"];
    let mut value = bits_per_second;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{} {}", three_figures(value), UNITS[unit])
}

/// Formats FLOP/s for people, from TFLOP/s up to EFLOP/s.
pub fn human_flops(flops: f64) -> String {
    if flops >= 1e18 {
        format!("{} EFLOP/s", three_figures(flops / 1e18))
    } else if flops >= 1e15 {
        format!("{} PFLOP/s", three_figures(flops / 1e15))
    } else {
        format!("{} TFLOP/s", three_figures(flops / 1e12))
    }
}

/// Formats seconds for people: ns, µs, ms or s with three significant figures.
pub fn human_seconds(seconds: f64) -> String {
    if seconds < 1e-6 {
        format!("{} ns", three_figures(seconds * 1e9))
    } else if seconds < 1e-3 {
        format!("{} µs", three_figures(seconds * 1e6))
    } else if seconds < 1.0 {
        format!("{} ms", three_figures(seconds * 1e3))
    } else {
        format!("{} s", three_figures(seconds))
    }
}

fn three_figures(value: f64) -> String {
    if value >= 100.0 || value == value.trunc() {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_canonical_forms() {
        let cases: &[(&str, &str)] = &[
            ("400 Gbit/s", "400 Gbit/s"),
            ("400Gbps", "400 Gbit/s"),
            ("1.6 Tbit/s", "1600 Gbit/s"),
            ("50 GB/s", "400 Gbit/s"),
        ];
        for (input, canonical) in cases {
            let rate: DataRate = input.parse().unwrap();
            assert_eq!(rate.to_string(), *canonical, "{input}");
            assert_eq!(canonical.parse::<DataRate>().unwrap(), rate);
        }
        assert_eq!("80 GiB".parse::<ByteSize>().unwrap().bytes(), 80 << 30);
        assert_eq!("1.5 ms".parse::<Duration>().unwrap().as_nanos(), 1_500_000);
        assert_eq!("1500 m".parse::<Distance>().unwrap().km(), 1.5);
    }

    #[test]
    fn wrong_kind_of_unit_names_what_it_measures() {
        let err = "400 GiB".parse::<DataRate>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "expected a data rate such as \"400 Gbit/s\", found unit \"GiB\" which measures a size in bytes"
        );
        assert!(matches!(
            "80 km".parse::<ByteSize>(),
            Err(UnitError::WrongKind { .. })
        ));
        assert!(matches!(
            "80".parse::<Distance>(),
            Err(UnitError::Malformed { .. })
        ));
        assert!(matches!(
            "-3 km".parse::<Distance>(),
            Err(UnitError::Negative { .. })
        ));
        assert!(matches!(
            "1.5 B".parse::<ByteSize>(),
            Err(UnitError::Fractional { .. })
        ));
    }
}
