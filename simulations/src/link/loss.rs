//! The loss process: decides, per packet that reaches the wire, whether it
//! is lost.

use super::config::LossModel;
use super::rng::{self, Stream};
use longhaul_core::rng::SeedRng;

/// Why the loss process dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LossVerdict {
    Kept,
    /// Lost by the random model.
    Random,
    /// Listed in the loss trace.
    Trace,
}

#[derive(Debug, Clone)]
enum Process {
    None,
    Bernoulli {
        p: f64,
    },
    GilbertElliott {
        p: f64,
        r: f64,
        loss_in_bad: f64,
        loss_in_good: f64,
        bad: bool,
    },
    Trace {
        drop: Vec<u64>,
        next: usize,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct LossState {
    process: Process,
    rng: SeedRng,
}

impl LossState {
    pub(crate) fn new(model: &LossModel, seed: u64) -> Self {
        let process = match model {
            LossModel::None => Process::None,
            LossModel::Bernoulli { p } => Process::Bernoulli { p: *p },
            LossModel::GilbertElliott {
                p,
                r,
                loss_in_bad,
                loss_in_good,
            } => Process::GilbertElliott {
                p: *p,
                r: *r,
                loss_in_bad: *loss_in_bad,
                loss_in_good: *loss_in_good,
                bad: false,
            },
            LossModel::Trace { drop } => Process::Trace {
                drop: drop.clone(),
                next: 0,
            },
        };
        Self {
            process,
            rng: rng::stream(seed, Stream::Loss),
        }
    }

    /// Decides the fate of the packet with offered index `index`. Indices
    /// passed in are increasing.
    ///
    /// Gilbert-Elliott follows netem: the state moves first (one draw), then
    /// the loss is drawn (a second draw) with the probability of the state the
    /// packet arrived in. The chain starts in the good state.
    pub(crate) fn decide(&mut self, index: u64) -> LossVerdict {
        let lost = match &mut self.process {
            Process::None => false,
            Process::Bernoulli { p } => self.rng.chance(*p),
            Process::GilbertElliott {
                p,
                r,
                loss_in_bad,
                loss_in_good,
                bad,
            } => {
                let was_bad = *bad;
                let switch = self.rng.chance(if was_bad { *r } else { *p });
                if switch {
                    *bad = !was_bad;
                }
                self.rng
                    .chance(if was_bad { *loss_in_bad } else { *loss_in_good })
            }
            Process::Trace { drop, next } => {
                while drop.get(*next).is_some_and(|&listed| listed < index) {
                    *next += 1;
                }
                return if drop.get(*next) == Some(&index) {
                    *next += 1;
                    LossVerdict::Trace
                } else {
                    LossVerdict::Kept
                };
            }
        };
        if lost {
            LossVerdict::Random
        } else {
            LossVerdict::Kept
        }
    }

    /// Replaces the model, keeping the RNG stream where it is.
    pub(crate) fn set_model(&mut self, model: &LossModel) {
        let rng = self.rng.clone();
        *self = Self::new(model, 0);
        self.rng = rng;
    }
}
