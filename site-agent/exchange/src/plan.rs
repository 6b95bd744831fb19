//! Who owns which shard of a fragment, and who sends what to whom.
//!
//! The live sites of a round are its participants less the excluded ones,
//! in the order of their ids (byte order): L₀ < L₁ < … < L_{M−1}. A
//! fragment of n elements is cut into M contiguous **shards**, shard k
//! owned by L_k:
//!
//! ```text
//! q = ⌊n / M⌋, r = n mod M
//! start_k = k·q + min(k, r),  len_k = q + (1 if k < r else 0)
//! ```
//!
//! so the first r shards hold one element more, the shards cover 0..n
//! exactly, in order, with no gap or overlap (a shard is empty when
//! n < M). Each shard is moved in **chunks** of at most `chunk_elements`
//! elements, cut from the shard's start (the last chunk of a shard may be
//! shorter): a chunk is the unit of a codec frame, of a wire frame and of
//! an acknowledgement, and every site cuts it the same way, so the owner
//! reduces the same element range from every site.
//!
//! **Reduce-scatter**: every live site sends each other owner its shard of
//! its own pseudo-gradient, chunk by chunk, encoded with the codec of the
//! link between the two (its own shard with the plan's `local` codec, so
//! that every contribution is quantised alike and the owner sums frames
//! only). **All-gather**: the owner sums the M contributions of each chunk
//! with [`longhaul_codec::reduce`] — weight w each, in site-id order —,
//! encodes that average once with the round's gather codec, and sends the
//! one frame to every other live site; every site (the owner included)
//! decodes the gathered frames into its result. One owner computes each
//! element and one frame carries it, so every site ends with the same bits,
//! whatever the link codecs. Per site that is 2(M−1)/M × the fragment's
//! encoded size on the wire (M−1 shards out, M−1 shards in, each 1/M).
//!
//! **Weight**: w = 1/M in f32, rounded down when fl(1/M)·M exceeds 1 (as
//! for M = 3), so the weights sum to at most 1, as the codec requires of
//! the collective. Excluded sites own no shard, send nothing and receive
//! nothing: the average is over the M live sites.
//!
//! A change of the live set (a site excluded mid-exchange) is a new plan:
//! shards move, and the exchange of the fragment starts again under it.
//! Frames carry the plan's [`CollectivePlan::digest`] (CRC-32C of n, the
//! chunk size and the live ids), so a frame cut under another plan is
//! refused rather than summed.

use std::ops::Range;

use longhaul_core::limits::{MAX_ID_LEN, MAX_SITES};
use thiserror::Error;

/// The most elements of one fragment: 2³⁶ (256 GiB of f32), so that every
/// offset fits a wire frame's u64 and every sum of lengths a u64 with room.
pub const MAX_FRAGMENT_ELEMENTS: u64 = 1 << 36;

/// Elements per chunk unless the plan says otherwise: 2¹⁸ (1 MiB of f32,
/// 257 KiB at 8 bits), a multiple of every standard block size.
pub const DEFAULT_CHUNK_ELEMENTS: u32 = 1 << 18;

/// The most elements of one chunk: the codec's bound on one frame (2²⁴).
pub const MAX_CHUNK_ELEMENTS: u32 = longhaul_codec::MAX_ELEMENTS as u32;

/// Why a plan cannot be made. Each names the offending site or value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    #[error("participants: none given")]
    NoParticipants,
    #[error("participants: {found} sites, at most {max}")]
    TooManySites { found: usize, max: usize },
    #[error("participants: site id {site:?} is {reason}")]
    SiteId { site: String, reason: &'static str },
    #[error("participants: site {site:?} is listed twice")]
    DuplicateParticipant { site: String },
    #[error("excluded: site {site:?} is not a participant")]
    ExcludedNotParticipant { site: String },
    #[error("excluded: every participant is excluded; no site is left to reduce")]
    NoLiveSite,
    #[error("elements: {found} elements, at most {max} in one fragment")]
    Elements { found: u64, max: u64 },
    #[error("chunk_elements: {found}, must be between 1 and {max}")]
    ChunkElements { found: u32, max: u32 },
    #[error("link codec between {a:?} and {b:?}: {reason}")]
    LinkCodec {
        a: String,
        b: String,
        reason: String,
    },
}

/// One shard: elements `start..start + len` of the fragment, reduced by
/// `owner`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub owner: String,
    pub start: u64,
    pub len: u64,
}

impl Shard {
    pub fn range(&self) -> Range<u64> {
        self.start..self.start + self.len
    }
}

/// The two phases of the collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// A site's own values of another site's shard, to its owner.
    ReduceScatter,
    /// The owner's average of its shard, to every other live site.
    AllGather,
}

/// One site sending one shard to another in one phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub phase: Phase,
    pub from: String,
    pub to: String,
    pub shard: u32,
    pub range: Range<u64>,
}

/// The collective of one fragment: a pure function of the live sites, the
/// element count and the chunk size (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectivePlan {
    live: Vec<String>,
    excluded: Vec<String>,
    elements: u64,
    chunk_elements: u32,
    shards: Vec<Shard>,
    digest: u32,
}

impl CollectivePlan {
    /// The plan for `participants` (any order) less `excluded`, for a
    /// fragment of `elements` elements moved in chunks of `chunk_elements`.
    /// Checks every input first: ids (1..=63 bytes, no duplicates), at most
    /// 1024 sites, exclusions among the participants, at least one live
    /// site, the element count and chunk size within their bounds.
    pub fn new<S: AsRef<str>>(
        participants: &[S],
        excluded: &[S],
        elements: u64,
        chunk_elements: u32,
    ) -> Result<CollectivePlan, PlanError> {
        if participants.is_empty() {
            return Err(PlanError::NoParticipants);
        }
        if participants.len() > MAX_SITES {
            return Err(PlanError::TooManySites {
                found: participants.len(),
                max: MAX_SITES,
            });
        }
        let mut sites: Vec<&str> = participants.iter().map(AsRef::as_ref).collect();
        for site in &sites {
            check_site_id(site)?;
        }
        sites.sort_unstable();
        if let Some(pair) = sites.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(PlanError::DuplicateParticipant {
                site: pair[0].to_string(),
            });
        }
        let mut out: Vec<String> = Vec::new();
        for site in excluded.iter().map(AsRef::as_ref) {
            if sites.binary_search(&site).is_err() {
                return Err(PlanError::ExcludedNotParticipant {
                    site: site.to_string(),
                });
            }
            if !out.iter().any(|s| s == site) {
                out.push(site.to_string());
            }
        }
        out.sort_unstable();
        let live: Vec<String> = sites
            .iter()
            .filter(|site| out.binary_search_by(|s| s.as_str().cmp(site)).is_err())
            .map(|site| site.to_string())
            .collect();
        if live.is_empty() {
            return Err(PlanError::NoLiveSite);
        }
        if elements > MAX_FRAGMENT_ELEMENTS {
            return Err(PlanError::Elements {
                found: elements,
                max: MAX_FRAGMENT_ELEMENTS,
            });
        }
        if !(1..=MAX_CHUNK_ELEMENTS).contains(&chunk_elements) {
            return Err(PlanError::ChunkElements {
                found: chunk_elements,
                max: MAX_CHUNK_ELEMENTS,
            });
        }
        let m = live.len() as u64;
        let (q, r) = (elements / m, elements % m);
        let shards = live
            .iter()
            .enumerate()
            .map(|(k, owner)| {
                let k = k as u64;
                Shard {
                    index: k as u32,
                    owner: owner.clone(),
                    start: k * q + k.min(r),
                    len: q + u64::from(k < r),
                }
            })
            .collect();
        let digest = digest(&live, elements, chunk_elements);
        Ok(CollectivePlan {
            live,
            excluded: out,
            elements,
            chunk_elements,
            shards,
            digest,
        })
    }

    /// The live sites, in id order: M = `live().len()`.
    pub fn live(&self) -> &[String] {
        &self.live
    }

    /// The excluded sites, in id order.
    pub fn excluded(&self) -> &[String] {
        &self.excluded
    }

    pub fn is_live(&self, site: &str) -> bool {
        self.position(site).is_some()
    }

    /// The index of a live site (and of the shard it owns).
    pub fn position(&self, site: &str) -> Option<usize> {
        self.live.binary_search_by(|s| s.as_str().cmp(site)).ok()
    }

    pub fn elements(&self) -> u64 {
        self.elements
    }

    pub fn chunk_elements(&self) -> u32 {
        self.chunk_elements
    }

    /// The shards, shard k owned by the k-th live site.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub fn shard(&self, index: u32) -> Option<&Shard> {
        self.shards.get(index as usize)
    }

    /// The shard `site` owns, if it is live.
    pub fn shard_of(&self, site: &str) -> Option<&Shard> {
        self.position(site).map(|k| &self.shards[k])
    }

    /// The weight of each contribution: 1/M, rounded down so that M of
    /// them sum to at most 1.
    pub fn weight(&self) -> f32 {
        let m = self.live.len();
        let w = 1.0 / m as f32;
        if f64::from(w) * m as f64 > 1.0 {
            f32::from_bits(w.to_bits() - 1)
        } else {
            w
        }
    }

    /// CRC-32C of the element count, the chunk size and the live ids (each
    /// followed by a zero byte): what frames carry to name their plan.
    pub fn digest(&self) -> u32 {
        self.digest
    }

    /// The chunks of shard `index`, in order (none for an empty or unknown
    /// shard).
    pub fn chunks(&self, index: u32) -> impl Iterator<Item = Range<u64>> + '_ {
        let range = self.shard(index).map_or(0..0, Shard::range);
        let step = u64::from(self.chunk_elements);
        (range.start..range.end)
            .step_by(step as usize)
            .map(move |start| start..(start + step).min(range.end))
    }

    /// Whether `offset..offset + length` is exactly one chunk of shard
    /// `index`.
    pub fn is_chunk(&self, index: u32, offset: u64, length: u32) -> bool {
        let Some(shard) = self.shard(index) else {
            return false;
        };
        let step = u64::from(self.chunk_elements);
        let end = shard.start + shard.len;
        if offset < shard.start || offset >= end || !(offset - shard.start).is_multiple_of(step) {
            return false;
        }
        u64::from(length) == step.min(end - offset)
    }

    /// Every transfer of the collective: the reduce-scatter's (shard by
    /// shard, senders in id order), then the all-gather's.
    pub fn transfers(&self) -> Vec<Transfer> {
        let mut out = Vec::new();
        for phase in [Phase::ReduceScatter, Phase::AllGather] {
            for shard in &self.shards {
                if shard.len == 0 {
                    continue;
                }
                for site in self.live.iter().filter(|s| **s != shard.owner) {
                    let (from, to) = match phase {
                        Phase::ReduceScatter => (site, &shard.owner),
                        Phase::AllGather => (&shard.owner, site),
                    };
                    out.push(Transfer {
                        phase,
                        from: from.clone(),
                        to: to.clone(),
                        shard: shard.index,
                        range: shard.range(),
                    });
                }
            }
        }
        out
    }

    /// What `site` sends, in [`CollectivePlan::transfers`] order.
    pub fn sends(&self, site: &str) -> Vec<Transfer> {
        self.transfers()
            .into_iter()
            .filter(|t| t.from == site)
            .collect()
    }

    /// What `site` receives, in [`CollectivePlan::transfers`] order.
    pub fn receives(&self, site: &str) -> Vec<Transfer> {
        self.transfers()
            .into_iter()
            .filter(|t| t.to == site)
            .collect()
    }
}

/// A site id as the rounds hold it: 1..=63 bytes, no NUL (the digest's
/// separator).
pub(crate) fn check_site_id(site: &str) -> Result<(), PlanError> {
    let reason = if site.is_empty() {
        Some("empty")
    } else if site.len() > MAX_ID_LEN {
        Some("longer than 63 bytes")
    } else if site.contains('\0') {
        Some("holding a NUL byte")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(PlanError::SiteId {
            site: site.chars().take(80).collect(),
            reason,
        }),
        None => Ok(()),
    }
}

fn digest(live: &[String], elements: u64, chunk_elements: u32) -> u32 {
    let mut crc = crc32c::crc32c(&elements.to_le_bytes());
    crc = crc32c::crc32c_append(crc, &chunk_elements.to_le_bytes());
    for site in live {
        crc = crc32c::crc32c_append(crc, site.as_bytes());
        crc = crc32c::crc32c_append(crc, &[0]);
    }
    crc
}
