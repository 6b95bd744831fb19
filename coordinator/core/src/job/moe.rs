//! The mixture-of-experts part of a job (`[model.moe]`,
//! `constraints.expert_parallel`) and its checks.

use serde::{Deserialize, Serialize};

use super::{JobSpec, ModelShape};
use crate::config::{FieldPath, Violation};

/// A mixture-of-experts model (`[model.moe]`): every layer's MLP is
/// `experts` routed experts of which each token uses `top_k`. The
/// parameters a token touches (`active_parameters`, counting attention,
/// shared experts, the router and the embeddings) set the FLOPs; all of
/// them (`parameters`) set the memory. Expert parallelism shards the
/// experts over the data-parallel replicas of a stage, which sit in one
/// site, so its all-to-all never crosses the WAN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeShape {
    /// Routed experts per layer, at least 2.
    pub experts: u32,
    /// Experts each token is routed to, fewer than `experts`.
    pub top_k: u32,
    /// Parameters used per token, at least the dense part plus `top_k` of
    /// the experts and less than `parameters`.
    pub active_parameters: u64,
}

/// What is wrong with `[model.moe]` (at `path`) for the model `m`, whose
/// embedding and LM head hold `embeddings` parameters each (as the cost
/// model counts them).
pub(super) fn moe_problems(
    path: &FieldPath,
    m: &ModelShape,
    moe: &MoeShape,
    embeddings: f64,
    out: &mut Vec<Violation>,
) {
    if moe.experts < 2 {
        out.push(Violation::new(
            path.key("experts"),
            format!("must be at least 2, found {}", moe.experts),
        ));
    }
    if moe.top_k == 0 || moe.top_k >= moe.experts {
        out.push(Violation::new(
            path.key("top_k"),
            format!(
                "must be at least 1 and fewer than the {} experts, found {}",
                moe.experts, moe.top_k
            ),
        ));
        return;
    }
    let active = moe.active_parameters;
    if active == 0 || active >= m.parameters {
        out.push(Violation::new(
            path.key("active_parameters"),
            format!(
                "must be at least 1 and fewer than the {} parameters, found {active}",
                m.parameters
            ),
        ));
        return;
    }
    // Every token uses the embedding and the LM head, the layers' dense
    // part and top_k of their experts: with the ends' 2e parameters set
    // aside, active − 2e ≥ (parameters − 2e) · top_k / experts (in u128,
    // exactly; e is a whole vocabulary × hidden product).
    let ends = 2 * embeddings as u128;
    let (active, all) = (u128::from(active), u128::from(m.parameters));
    if active <= ends {
        out.push(Violation::new(
            path.key("active_parameters"),
            format!(
                "{active} is not more than the {ends} parameters of the embedding and the LM head, which every token uses"
            ),
        ));
    } else if (active - ends) * u128::from(moe.experts) < (all - ends) * u128::from(moe.top_k) {
        out.push(Violation::new(
            path.key("active_parameters"),
            format!(
                "{active} is less than {}top_k / experts = {} / {} of the {} parameters{}, which every token uses at least",
                if ends > 0 {
                    format!("the embedding and LM head ({ends}) plus ")
                } else {
                    String::new()
                },
                moe.top_k,
                moe.experts,
                all - ends,
                if ends > 0 { " in the layers" } else { "" },
            ),
        ));
    }
}

/// What is wrong with `constraints.expert_parallel = ep` (at `path`) for
/// `spec`: a degree on a dense model, one that does not divide the experts,
/// `data_parallel` or the micro-batches of a step.
pub(super) fn expert_parallel_problems(
    path: FieldPath,
    spec: &JobSpec,
    ep: u32,
    out: &mut Vec<Violation>,
) {
    match &spec.model.moe {
        None if ep > 1 => out.push(Violation::new(
            path,
            format!("expert-parallel degree {ep} needs a mixture-of-experts model ([model.moe])"),
        )),
        Some(moe) if moe.experts > 0 && !moe.experts.is_multiple_of(ep) => {
            out.push(Violation::new(
                path,
                format!(
                    "expert-parallel degree {ep} does not divide the {} experts",
                    moe.experts
                ),
            ))
        }
        // Groups of ep replicas: the replicas come in whole groups.
        Some(_) => {
            let sequences = spec.batch.global_batch / spec.batch.micro_batch.max(1);
            if let Some(dp) = spec
                .constraints
                .data_parallel
                .filter(|&dp| dp > 0 && !dp.is_multiple_of(ep))
            {
                out.push(Violation::new(
                    path,
                    format!(
                        "expert-parallel degree {ep} does not divide data_parallel {dp}: replicas share out the experts in whole groups of {ep}"
                    ),
                ));
            } else if sequences > 0 && !sequences.is_multiple_of(ep) {
                out.push(Violation::new(
                    path,
                    format!(
                        "expert-parallel degree {ep} does not divide the {sequences} micro-batches of a step (global_batch / micro_batch), so no data-parallel degree holds whole groups of {ep} replicas"
                    ),
                ));
            }
        }
        None => {}
    }
}
