//! The three roles of the collective, as state machines fed with frames:
//! what a site encodes ([`Contributor`]), what an owner sums and re-encodes
//! ([`ShardReducer`]), and what every site decodes into its result
//! ([`Assembler`]). No I/O: the transport hands them frames in any order,
//! any number of times, and sends what they produce.
//!
//! A chunk is encoded once per round: error feedback changes the encoder's
//! residual at every encode, so a chunk sent again must be the bytes sent
//! the first time (the transport keeps them until acknowledged).

use std::collections::BTreeMap;
use std::ops::Range;

use longhaul_codec::{
    Contribution, DecodeError, EncodeError, Encoder, EncoderConfig, FrameHeader, ReduceError,
};
use longhaul_core::state::LinkCodec;
use thiserror::Error;

use crate::plan::{CollectivePlan, PlanError, Shard};

/// Why a frame was not taken, or a chunk not encoded. Nothing changed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CollectiveError {
    #[error("site {site:?}: not a live site of the plan")]
    NotLive { site: String },
    #[error("shard {shard}: the plan has {shards} shards")]
    NoShard { shard: u32, shards: usize },
    #[error("shard {shard}: elements {offset}..+{length} are not one of its chunks")]
    NotAChunk {
        shard: u32,
        offset: u64,
        length: u32,
    },
    #[error("shard {shard}: owned by {owner:?}, not by this reducer's site")]
    NotThisShard { shard: u32, owner: String },
    #[error("frame from {site:?} for elements {offset}..+{length}: {source}")]
    Frame {
        site: String,
        offset: u64,
        length: u32,
        #[source]
        source: DecodeError,
    },
    #[error(
        "frame from {site:?} for elements {offset}..: differs from the one already taken for that chunk"
    )]
    Conflict { site: String, offset: u64 },
    #[error("fragment: {found} elements given, the plan has {expected}")]
    FragmentLength { expected: u64, found: usize },
    #[error("encoding elements {offset}..: {source}")]
    Encode {
        offset: u64,
        #[source]
        source: EncodeError,
    },
    #[error("reducing elements {offset}..: {source}")]
    Reduce {
        offset: u64,
        #[source]
        source: ReduceError,
    },
}

/// The codec of each link of the collective, of a site's own shard
/// (`local`) and of the owners' averages (`gather`, never with error
/// feedback: an owner's shard moves when the live set changes, so there is
/// no residual to carry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkCodecs {
    links: BTreeMap<(String, String), EncoderConfig>,
    local: EncoderConfig,
    gather: EncoderConfig,
}

impl LinkCodecs {
    /// The same codec on every link, locally and for the averages.
    pub fn uniform(config: EncoderConfig) -> LinkCodecs {
        LinkCodecs {
            links: BTreeMap::new(),
            local: config,
            gather: EncoderConfig {
                error_feedback: false,
                ..config
            },
        }
    }

    /// `config` on the link between `a` and `b` (both directions).
    pub fn with_link(mut self, a: &str, b: &str, config: EncoderConfig) -> LinkCodecs {
        self.links.insert(pair(a, b), config);
        self
    }

    /// A round's codecs (`RoundRecord::links`). The local and gather codecs
    /// are the widest link's (most bits, then the smallest block, the first
    /// listed on a tie), as the round's `codec_bits` is. A codec the frame
    /// format lacks (bits 0, uncompressed f32) is refused, naming the link.
    pub fn from_round(links: &[LinkCodec]) -> Result<LinkCodecs, PlanError> {
        let mut widest: Option<EncoderConfig> = None;
        let mut map = BTreeMap::new();
        for link in links {
            let [a, b] = &link.between;
            let config =
                EncoderConfig::new(link.bits, link.block_size, link.error_feedback, link.zstd)
                    .map_err(|error| PlanError::LinkCodec {
                        a: a.clone(),
                        b: b.clone(),
                        reason: error.to_string(),
                    })?;
            let wider = |w: &EncoderConfig| {
                (
                    config.codec.bits(),
                    std::cmp::Reverse(config.codec.block_size()),
                ) > (w.codec.bits(), std::cmp::Reverse(w.codec.block_size()))
            };
            if widest.as_ref().is_none_or(wider) {
                widest = Some(config);
            }
            map.insert(pair(a, b), config);
        }
        let Some(widest) = widest else {
            // No links: a round of one site, which sends nothing; bf16
            // keeps its own shard within 2⁻⁸ of its values.
            return Ok(LinkCodecs::uniform(EncoderConfig {
                codec: longhaul_codec::Codec::bf16(),
                error_feedback: false,
                zstd: false,
            }));
        };
        let mut codecs = LinkCodecs::uniform(widest);
        codecs.links = map;
        Ok(codecs)
    }

    /// The codec `from` encodes its values of `to`'s shard with: the link's,
    /// the local one when `from == to` or the round names no such link.
    pub fn link(&self, from: &str, to: &str) -> EncoderConfig {
        if from == to {
            return self.local;
        }
        self.links
            .get(&pair(from, to))
            .copied()
            .unwrap_or(self.local)
    }

    pub fn gather(&self) -> EncoderConfig {
        self.gather
    }
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

/// One encoded chunk: what a wire frame carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The site it goes to.
    pub to: String,
    pub shard: u32,
    pub offset: u64,
    pub length: u32,
    /// A codec frame of `length` elements.
    pub frame: Vec<u8>,
}

/// A site's encoders for one fragment, one per codec its links use (their
/// residuals persist from round to round). An element's residual lives in
/// the encoder of the codec its shard's link uses; should a new plan move
/// it to a link of another codec, it waits there until the element is next
/// sent with that codec.
/// A [`Contributor`]'s residuals at one moment ([`Contributor::checkpoint`]).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    residuals: Vec<(EncoderConfig, Vec<f32>)>,
}

#[derive(Debug)]
pub struct Contributor {
    elements: u64,
    encoders: Vec<Encoder>,
}

impl Contributor {
    pub fn new(elements: u64) -> Contributor {
        Contributor {
            elements,
            encoders: Vec::new(),
        }
    }

    /// The fragment's length it encodes.
    pub fn elements(&self) -> u64 {
        self.elements
    }

    /// Encodes elements `range` of `fragment` (the site's whole fragment)
    /// with `config`, carrying that codec's residual.
    pub fn encode_chunk(
        &mut self,
        config: EncoderConfig,
        fragment: &[f32],
        range: Range<u64>,
    ) -> Result<Vec<u8>, CollectiveError> {
        if fragment.len() as u64 != self.elements {
            return Err(CollectiveError::FragmentLength {
                expected: self.elements,
                found: fragment.len(),
            });
        }
        let encoder = match self.encoders.iter().position(|e| e.config() == config) {
            Some(k) => &mut self.encoders[k],
            None => {
                self.encoders
                    .push(Encoder::new(config, self.elements as usize));
                let last = self.encoders.len() - 1;
                &mut self.encoders[last]
            }
        };
        let (start, end) = (range.start as usize, range.end as usize);
        let values = fragment.get(start..end).unwrap_or_default();
        encoder
            .encode_range(start, values)
            .map(|frame| frame.into_bytes())
            .map_err(|source| CollectiveError::Encode {
                offset: range.start,
                source,
            })
    }

    /// The residuals as they are now, for [`Contributor::restore`]: what a
    /// caller keeps while the frames of an encoding are in flight, to undo
    /// the encoding if the exchange fails and the fragment is planned again.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            residuals: self
                .encoders
                .iter()
                .map(|e| (e.config(), e.residual().to_vec()))
                .collect(),
        }
    }

    /// Puts the residuals back as [`Contributor::checkpoint`] took them; an
    /// encoder made since is dropped (it starts from zero when next used,
    /// as it did then).
    pub fn restore(&mut self, checkpoint: Checkpoint) {
        self.encoders.retain(|e| {
            checkpoint
                .residuals
                .iter()
                .any(|(config, _)| *config == e.config())
        });
        for encoder in &mut self.encoders {
            if let Some((_, saved)) = checkpoint
                .residuals
                .iter()
                .find(|(config, _)| *config == encoder.config())
            {
                // Taken from this encoder, so of its length.
                let _ = encoder.restore_residual(saved);
            }
        }
    }

    /// Every chunk `site` contributes to the reduce-scatter of `plan`, its
    /// own shard's included (addressed to itself), shard by shard, each
    /// encoded with its link's codec. On an error nothing changed: the
    /// residuals are put back.
    pub fn contributions(
        &mut self,
        plan: &CollectivePlan,
        codecs: &LinkCodecs,
        site: &str,
        fragment: &[f32],
    ) -> Result<Vec<Chunk>, CollectiveError> {
        let checkpoint = self.checkpoint();
        self.contributions_from(&checkpoint, plan, codecs, site, fragment)
    }

    /// [`Contributor::contributions`] for a caller that holds `checkpoint`,
    /// taken just before, anyway: on an error the residuals are put back
    /// from it, and no second copy is made.
    pub fn contributions_from(
        &mut self,
        checkpoint: &Checkpoint,
        plan: &CollectivePlan,
        codecs: &LinkCodecs,
        site: &str,
        fragment: &[f32],
    ) -> Result<Vec<Chunk>, CollectiveError> {
        if !plan.is_live(site) {
            return Err(CollectiveError::NotLive {
                site: site.to_string(),
            });
        }
        let result = self.encode_contributions(plan, codecs, site, fragment);
        if result.is_err() {
            self.restore(checkpoint.clone());
        }
        result
    }

    fn encode_contributions(
        &mut self,
        plan: &CollectivePlan,
        codecs: &LinkCodecs,
        site: &str,
        fragment: &[f32],
    ) -> Result<Vec<Chunk>, CollectiveError> {
        let mut out = Vec::new();
        for shard in plan.shards() {
            let config = codecs.link(site, &shard.owner);
            for range in plan.chunks(shard.index) {
                let frame = self.encode_chunk(config, fragment, range.clone())?;
                out.push(Chunk {
                    to: shard.owner.clone(),
                    shard: shard.index,
                    offset: range.start,
                    length: (range.end - range.start) as u32,
                    frame,
                });
            }
        }
        Ok(out)
    }
}

/// Whether a frame was new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Taken; for a reducer, the chunk still waits for other sites.
    New,
    /// Taken, and it completed chunk `chunk` (a reducer's: its average is
    /// ready, [`ShardReducer::gathered`]).
    Completed { chunk: usize },
    /// Already held, byte for byte: nothing changed.
    Duplicate,
}

/// Checks a frame's header (element count against the chunk) before its
/// payload, then the whole frame.
fn check_frame(site: &str, offset: u64, length: u32, frame: &[u8]) -> Result<(), CollectiveError> {
    let refused = |source| CollectiveError::Frame {
        site: site.to_string(),
        offset,
        length,
        source,
    };
    let (header, _) = FrameHeader::parse(frame).map_err(refused)?;
    if header.element_count != length as usize {
        return Err(refused(DecodeError::AccumulatorLength {
            frame: header.element_count,
            accumulator: length as usize,
        }));
    }
    longhaul_codec::check(frame).map_err(refused)?;
    Ok(())
}

/// The index of chunk `offset..+length` of `shard` in `plan`.
fn chunk_index(
    plan: &CollectivePlan,
    shard: u32,
    offset: u64,
    length: u32,
) -> Result<usize, CollectiveError> {
    let Some(s) = plan.shard(shard) else {
        return Err(CollectiveError::NoShard {
            shard,
            shards: plan.shards().len(),
        });
    };
    if !plan.is_chunk(shard, offset, length) {
        return Err(CollectiveError::NotAChunk {
            shard,
            offset,
            length,
        });
    }
    Ok(((offset - s.start) / u64::from(plan.chunk_elements())) as usize)
}

#[derive(Debug)]
struct ReduceSlot {
    offset: u64,
    length: u32,
    /// One per live site, in id order, until the chunk is reduced.
    frames: Vec<Option<Vec<u8>>>,
    gathered: Option<Vec<u8>>,
}

/// An owner's shard: the live sites' contributions chunk by chunk; once a
/// chunk has all M, their weighted sum in site-id order, encoded once with
/// the gather codec. Frames are checked whole when taken, so a bad one is
/// refused on arrival and never reaches the sum.
#[derive(Debug)]
pub struct ShardReducer {
    plan: CollectivePlan,
    shard: Shard,
    gather: EncoderConfig,
    slots: Vec<ReduceSlot>,
    complete: usize,
}

impl ShardReducer {
    /// The reducer of `site`'s shard (`site` must be live).
    pub fn new(
        plan: &CollectivePlan,
        site: &str,
        gather: EncoderConfig,
    ) -> Result<ShardReducer, CollectiveError> {
        let Some(shard) = plan.shard_of(site).cloned() else {
            return Err(CollectiveError::NotLive {
                site: site.to_string(),
            });
        };
        let slots = plan
            .chunks(shard.index)
            .map(|range| ReduceSlot {
                offset: range.start,
                length: (range.end - range.start) as u32,
                frames: vec![None; plan.live().len()],
                gathered: None,
            })
            .collect();
        Ok(ShardReducer {
            plan: plan.clone(),
            shard,
            gather,
            slots,
            complete: 0,
        })
    }

    pub fn shard(&self) -> &Shard {
        &self.shard
    }

    /// Takes `from`'s contribution to chunk `offset..+length` of `shard`.
    pub fn accept(
        &mut self,
        from: &str,
        shard: u32,
        offset: u64,
        length: u32,
        frame: Vec<u8>,
    ) -> Result<Accepted, CollectiveError> {
        let Some(site) = self.plan.position(from) else {
            return Err(CollectiveError::NotLive {
                site: from.to_string(),
            });
        };
        if shard != self.shard.index {
            let owner = self.plan.shard(shard).map(|s| s.owner.clone());
            return Err(match owner {
                Some(owner) => CollectiveError::NotThisShard { shard, owner },
                None => CollectiveError::NoShard {
                    shard,
                    shards: self.plan.shards().len(),
                },
            });
        }
        let index = chunk_index(&self.plan, shard, offset, length)?;
        let slot = &self.slots[index];
        if slot.gathered.is_some() {
            // Reduced already: the frames were dropped, so a resend is
            // taken as a duplicate without comparing its bytes.
            return Ok(Accepted::Duplicate);
        }
        if let Some(held) = &slot.frames[site] {
            return if *held == frame {
                Ok(Accepted::Duplicate)
            } else {
                Err(CollectiveError::Conflict {
                    site: from.to_string(),
                    offset,
                })
            };
        }
        check_frame(from, offset, length, &frame)?;
        let weight = self.plan.weight();
        let slot = &mut self.slots[index];
        slot.frames[site] = Some(frame);
        if slot.frames.iter().any(Option::is_none) {
            return Ok(Accepted::New);
        }
        let contributions: Vec<Contribution<'_>> = self
            .plan
            .live()
            .iter()
            .zip(&slot.frames)
            .filter_map(|(site, frame)| {
                frame.as_deref().map(|frame| Contribution {
                    site,
                    frame,
                    weight,
                })
            })
            .collect();
        let mut average = vec![0.0f32; slot.length as usize];
        let reduced = longhaul_codec::reduce(&contributions, &mut average);
        if let Err(source) = reduced {
            // Every frame was checked when taken, so this is not expected;
            // should it happen, the last frame is given back (not taken).
            slot.frames[site] = None;
            return Err(CollectiveError::Reduce { offset, source });
        }
        let mut encoder = Encoder::new(self.gather, average.len());
        let gathered = encoder
            .encode(&average)
            .map_err(|source| CollectiveError::Encode { offset, source });
        match gathered {
            Ok(gathered) => {
                slot.gathered = Some(gathered.into_bytes());
                slot.frames = Vec::new();
                self.complete += 1;
                Ok(Accepted::Completed { chunk: index })
            }
            Err(error) => {
                slot.frames[site] = None;
                Err(error)
            }
        }
    }

    /// Chunk `chunk`'s average, once reduced: (offset, length, frame).
    pub fn gathered(&self, chunk: usize) -> Option<(u64, u32, &[u8])> {
        let slot = self.slots.get(chunk)?;
        slot.gathered
            .as_deref()
            .map(|frame| (slot.offset, slot.length, frame))
    }

    /// Chunks of the shard.
    pub fn chunks(&self) -> usize {
        self.slots.len()
    }

    pub fn is_complete(&self) -> bool {
        self.complete == self.slots.len()
    }

    /// The live sites some chunk still waits for, in id order.
    pub fn waiting_on(&self) -> Vec<&str> {
        let live = self.plan.live();
        (0..live.len())
            .filter(|&k| {
                self.slots
                    .iter()
                    .any(|slot| slot.gathered.is_none() && slot.frames[k].is_none())
            })
            .map(|k| live[k].as_str())
            .collect()
    }
}

/// A site's reduced fragment, assembled from the owners' averages: each
/// gathered frame decoded (weight 1, onto zeros) into its range, once.
#[derive(Debug)]
pub struct Assembler {
    plan: CollectivePlan,
    out: Vec<f32>,
    /// Per shard, which chunks are in.
    have: Vec<Vec<bool>>,
    missing: usize,
}

impl Assembler {
    pub fn new(plan: &CollectivePlan) -> Assembler {
        let have: Vec<Vec<bool>> = plan
            .shards()
            .iter()
            .map(|s| vec![false; plan.chunks(s.index).count()])
            .collect();
        let missing = have.iter().map(Vec::len).sum();
        Assembler {
            plan: plan.clone(),
            out: vec![0.0; plan.elements() as usize],
            have,
            missing,
        }
    }

    /// Takes `from`'s average of chunk `offset..+length` of `shard`; `from`
    /// must be the shard's owner.
    pub fn accept(
        &mut self,
        from: &str,
        shard: u32,
        offset: u64,
        length: u32,
        frame: &[u8],
    ) -> Result<Accepted, CollectiveError> {
        let index = chunk_index(&self.plan, shard, offset, length)?;
        let owner = &self.plan.shards()[shard as usize].owner;
        if owner != from {
            return Err(CollectiveError::NotThisShard {
                shard,
                owner: owner.clone(),
            });
        }
        if self.have[shard as usize][index] {
            return Ok(Accepted::Duplicate);
        }
        check_frame(from, offset, length, frame)?;
        let range = offset as usize..(offset + u64::from(length)) as usize;
        longhaul_codec::decode_add(frame, &mut self.out[range], 1.0).map_err(|source| {
            CollectiveError::Frame {
                site: from.to_string(),
                offset,
                length,
                source,
            }
        })?;
        self.have[shard as usize][index] = true;
        self.missing -= 1;
        Ok(Accepted::Completed { chunk: index })
    }

    /// Whether every chunk of shard `shard` is in (false for no such shard).
    pub fn shard_complete(&self, shard: u32) -> bool {
        self.have
            .get(shard as usize)
            .is_some_and(|chunks| chunks.iter().all(|&held| held))
    }

    /// Chunks not yet in.
    pub fn missing(&self) -> usize {
        self.missing
    }

    pub fn is_complete(&self) -> bool {
        self.missing == 0
    }

    /// The values so far: the chunks in, zeros elsewhere.
    pub fn partial(&self) -> &[f32] {
        &self.out
    }

    /// The reduced fragment, once every chunk is in.
    pub fn result(&self) -> Option<&[f32]> {
        self.is_complete().then_some(&self.out[..])
    }

    /// [`longhaul_codec::fragment_hash`] of the result, once complete:
    /// what the site reports to the round.
    pub fn hash(&self) -> Option<String> {
        self.result().map(longhaul_codec::fragment_hash)
    }
}

/// The reduced fragment the collective gives `plan`'s live sites when each
/// contributes `fragments[site]` with a fresh [`Contributor`] (no residual
/// yet, as in a first round): the reference a transport must reproduce
/// bit for bit, computed in one place with the same state machines.
pub fn reduce_in_memory(
    plan: &CollectivePlan,
    codecs: &LinkCodecs,
    fragments: &BTreeMap<String, Vec<f32>>,
) -> Result<Vec<f32>, CollectiveError> {
    let mut reducers = Vec::new();
    for site in plan.live() {
        reducers.push(ShardReducer::new(plan, site, codecs.gather())?);
    }
    for site in plan.live() {
        let values = fragments
            .get(site)
            .ok_or_else(|| CollectiveError::FragmentLength {
                expected: plan.elements(),
                found: 0,
            })?;
        let chunks = Contributor::new(plan.elements()).contributions(plan, codecs, site, values)?;
        for chunk in chunks {
            reducers[chunk.shard as usize].accept(
                site,
                chunk.shard,
                chunk.offset,
                chunk.length,
                chunk.frame,
            )?;
        }
    }
    let mut assembler = Assembler::new(plan);
    for reducer in &reducers {
        for k in 0..reducer.chunks() {
            if let Some((offset, length, frame)) = reducer.gathered(k) {
                assembler.accept(
                    &reducer.shard().owner,
                    reducer.shard().index,
                    offset,
                    length,
                    frame,
                )?;
            }
        }
    }
    Ok(assembler.partial().to_vec())
}
