//! The simulator's analytical tier: what one training step costs in each cross-site mode,
//! from the placement cost model and the sync planner, fast enough for sweeps.
//!
//! [`Comparison::prepare`] places the job once per mode on the topology as given; each
//! [`Comparison::at`] then re-costs those plans on the WAN of one sweep point
//! ([`WanSetting`], applied to every WAN link) with [`longhaul_core::placement::recost`],
//! without searching again, so a point costs what the cost model and the planner cost
//! (microseconds to a millisecond), not a placement. It reads no clock, does no I/O and draws
//! no random numbers: the same inputs give the same figures.
//!
//! # Modes
//!
//! - **Synchronous data parallelism across sites** (`sync-dp`): placement with
//!   `cross_site_mode = "data-parallel"`: whole replicas per site (the global batch split
//!   over all of them), without DiLoCo's outer state, every step ending with the gradient
//!   exchanged across the sites over the WAN at the training precision, not overlapped with
//!   compute, as the cost model counts a data-parallel all-reduce. Step = t + E₁, with t the
//!   inner step (whose in-site all-reduce is the reduce-scatter and all-gather around the
//!   exchange) and E₁ the sync planner's exchange time for H = 1, one fragment, τ = 0 and b₀
//!   bits (the training precision, no quantisation): the planner's collective and its
//!   loss-limited rates, the same model DiLoCo's sync is costed with.
//! - **Pipeline** (`pipeline`): placement with `cross_site_mode = "pipeline"`, which may keep
//!   the whole job in one site when that is faster; its stage boundaries that cross the WAN
//!   are re-costed at each point.
//! - **DiLoCo** (`diloco`): placement with `cross_site_mode = "diloco"`; at each point the
//!   sync planner plans again (H, fragments, τ, codec), so the figures are DiLoCo as the
//!   planner would configure it on that WAN. Step = t + (r + E)/H.
//!
//! # Figures
//!
//! For each mode: the step time; the **compute utilisation**, the step the same plan takes
//! on a WAN that costs nothing (0 km, no loss, 1 Pbit/s) over its step here, so it is the
//! fraction of the step not spent waiting for the WAN; the **exposed communication** per step,
//! the difference of the two; the WAN bytes per step (both directions, all links); and
//! whether the mode is **viable**, its utilisation at least [`Comparison::viable_utilisation`].
//!
//! # Against published runs
//!
//! `tests/des/published.rs` runs this tier on the setting of the INTELLECT-1 Technical Report
//! (Jaghouar et al., arXiv:2412.01152, 2024, §3: 10B parameters, H = 100, int8 ring
//! all-reduce, up to 14 nodes of 8 H100) and checks its compute utilisation against the
//! report's USA, USA + Europe and Global figures (95.7 %, 85.6 %, 83.0 %) within bounds
//! stated there, with what the report leaves unknown (nodes per setting, loss, the rate per
//! hop within its 0.5–4 Gbit/s range) and how the test chooses it.

use longhaul_core::cost::CostParams;
use longhaul_core::job::{Diloco, JobSpec, ModeConstraint};
use longhaul_core::placement::{Plan, place_with, recost};
use longhaul_core::sync::Codec;
use longhaul_core::topology::Topology;
use longhaul_core::units::{DataRate, Distance};
use serde::Serialize;
use thiserror::Error;

/// Why a comparison cannot be made.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum AnalyticError {
    /// A sweep setting is out of range; names the setting.
    #[error("`{field}`: {message}")]
    Invalid { field: String, message: String },
    /// No mode could be placed at all.
    #[error("the job cannot be placed in any mode: {0}")]
    Unplaceable(String),
}

fn invalid(field: &str, message: impl Into<String>) -> AnalyticError {
    AnalyticError::Invalid {
        field: field.to_string(),
        message: message.into(),
    }
}

/// A cross-site mode of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    SyncDp,
    Pipeline,
    Diloco,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::SyncDp, Mode::Pipeline, Mode::Diloco];

    pub fn name(self) -> &'static str {
        match self {
            Mode::SyncDp => "sync-dp",
            Mode::Pipeline => "pipeline",
            Mode::Diloco => "diloco",
        }
    }
}

/// What one sweep point changes, on every WAN link of the topology; `None` keeps the
/// topology's value. `inner_steps` and `bits` fix DiLoCo's H and codec width.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct WanSetting {
    pub distance_km: Option<f64>,
    pub link_rate_bits_per_second: Option<u64>,
    pub loss: Option<f64>,
    pub parallel_links: Option<u32>,
    pub inner_steps: Option<u32>,
    pub bits: Option<u32>,
}

impl WanSetting {
    /// The first setting out of range, named.
    pub fn check(&self) -> Result<(), AnalyticError> {
        if let Some(km) = self.distance_km
            && !(0.0..=40_075.0).contains(&km)
        {
            return Err(invalid(
                "distance_km",
                format!("must be within [0, 40075] km, found {km}"),
            ));
        }
        if let Some(loss) = self.loss
            && !(0.0..1.0).contains(&loss)
        {
            return Err(invalid(
                "loss",
                format!("must be within [0, 1), found {loss}"),
            ));
        }
        if self.link_rate_bits_per_second == Some(0) {
            return Err(invalid("link_rate", "must be positive"));
        }
        if self.parallel_links == Some(0) {
            return Err(invalid("parallel_links", "must be at least 1"));
        }
        if self.inner_steps == Some(0) {
            return Err(invalid("inner_steps", "must be at least 1"));
        }
        if let Some(bits) = self.bits
            && !Codec::standard().iter().any(|c| c.bits == bits)
        {
            return Err(invalid("bits", format!("must be 16, 8 or 4, found {bits}")));
        }
        Ok(())
    }

    /// `topology` with this setting on every WAN link, or the setting that is out of range.
    pub fn apply(&self, topology: &Topology) -> Result<Topology, AnalyticError> {
        self.check()?;
        let mut out = topology.clone();
        let distance = self.distance_km.and_then(Distance::from_km);
        for link in &mut out.links {
            if let Some(d) = distance {
                link.distance = d;
            }
            if let Some(rate) = self.link_rate_bits_per_second {
                link.link_rate = DataRate::from_bits_per_second(rate);
            }
            if let Some(loss) = self.loss {
                link.loss = loss;
            }
            if let Some(n) = self.parallel_links {
                link.parallel_links = n;
            }
        }
        Ok(out)
    }

    /// `job` with this setting's fixed H and bits.
    fn job(&self, job: &JobSpec, params: &CostParams) -> JobSpec {
        let mut job = job.clone();
        if self.inner_steps.is_some() || self.bits.is_some() {
            let mut policy = job
                .diloco
                .clone()
                .unwrap_or_else(|| Diloco::new(params.default_inner_steps));
            if let Some(h) = self.inner_steps {
                policy.inner_steps = h;
                policy.max_inner_steps = Some(h);
            }
            if let Some(bits) = self.bits {
                policy.bits = Some(bits);
            }
            job.diloco = Some(policy);
        }
        job
    }
}

/// One mode at one sweep point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeOutcome {
    pub mode: Mode,
    /// The sites the mode's plan uses, in its order.
    pub sites: Vec<String>,
    pub step_seconds: f64,
    /// The step on a WAN that costs nothing, over the step here.
    pub compute_utilisation: f64,
    /// Step time spent waiting for the WAN, per step.
    pub exposed_communication_seconds: f64,
    pub wan_bytes_per_step: f64,
    /// DiLoCo's H and codec width as the planner chose them at this point.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inner_steps: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bits: Option<u32>,
    pub viable: bool,
}

/// A mode that has no figure at a point (or at all), and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unavailable {
    pub mode: Mode,
    pub reason: String,
}

/// Every mode at one sweep point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    pub setting: WanSetting,
    /// RTT of the first WAN link at this point (5 µs/km each way plus its overhead).
    pub rtt_seconds: Option<f64>,
    pub outcomes: Vec<ModeOutcome>,
    pub unavailable: Vec<Unavailable>,
}

impl Point {
    pub fn outcome(&self, mode: Mode) -> Option<&ModeOutcome> {
        self.outcomes.iter().find(|o| o.mode == mode)
    }
}

/// The plans of each mode on one topology, ready to be re-costed at sweep points.
#[derive(Debug, Clone)]
pub struct Comparison {
    topology: Topology,
    job: JobSpec,
    params: CostParams,
    /// Each mode's plan on the topology as given, or why it has none.
    pipeline: Result<Plan, String>,
    diloco: Result<Plan, String>,
    data_parallel: Result<Plan, String>,
    /// The least compute utilisation at which a mode counts as viable. Default 0.9.
    pub viable_utilisation: f64,
}

/// A WAN that costs nothing: what a plan's step is without it.
const FREE_WAN: WanSetting = WanSetting {
    distance_km: Some(0.0),
    link_rate_bits_per_second: Some(1_000_000_000_000_000),
    loss: Some(0.0),
    parallel_links: None,
    inner_steps: None,
    bits: None,
};

impl Comparison {
    /// Places `job` on `topology` once per mode.
    pub fn prepare(
        topology: &Topology,
        job: &JobSpec,
        params: &CostParams,
    ) -> Result<Self, AnalyticError> {
        let forced = |mode: ModeConstraint| {
            let mut job = job.clone();
            job.constraints.cross_site_mode = Some(mode);
            place_with(topology, &job, params).map_err(|e| e.to_string())
        };
        let pipeline = forced(ModeConstraint::Pipeline);
        let diloco = forced(ModeConstraint::Diloco);
        let data_parallel = forced(ModeConstraint::DataParallel);
        if let (Err(p), Err(d), Err(s)) = (&pipeline, &diloco, &data_parallel) {
            return Err(AnalyticError::Unplaceable(format!(
                "as a pipeline: {p}; as DiLoCo: {d}; as cross-site data parallelism: {s}"
            )));
        }
        Ok(Self {
            topology: topology.clone(),
            job: job.clone(),
            params: params.clone(),
            pipeline,
            diloco,
            data_parallel,
            viable_utilisation: 0.9,
        })
    }

    /// The plan a mode is costed on, as placed on the topology as given, or why it has none.
    pub fn plan(&self, mode: Mode) -> Result<&Plan, &str> {
        let plan = match mode {
            Mode::Pipeline => &self.pipeline,
            Mode::Diloco => &self.diloco,
            Mode::SyncDp => &self.data_parallel,
        };
        plan.as_ref().map_err(String::as_str)
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn job(&self) -> &JobSpec {
        &self.job
    }

    /// Every mode at one sweep point.
    pub fn at(&self, setting: &WanSetting) -> Result<Point, AnalyticError> {
        let topology = setting.apply(&self.topology)?;
        let free = FREE_WAN.apply(&self.topology)?;
        let job = setting.job(&self.job, &self.params);
        let mut outcomes = Vec::new();
        let mut unavailable = Vec::new();
        let mut push = |mode: Mode, outcome: Result<ModeOutcome, String>| match outcome {
            Ok(o) => outcomes.push(o),
            Err(reason) => unavailable.push(Unavailable { mode, reason }),
        };
        for mode in Mode::ALL {
            let outcome = self
                .plan(mode)
                .map_err(str::to_string)
                .and_then(|plan| self.recosted(mode, plan, &job, &topology, &free));
            push(mode, outcome);
        }
        outcomes.sort_by_key(|o| o.mode);
        unavailable.sort_by_key(|u| u.mode);
        Ok(Point {
            setting: *setting,
            rtt_seconds: topology.links.first().map(|l| l.rtt_seconds()),
            outcomes,
            unavailable,
        })
    }

    fn outcome(
        &self,
        mode: Mode,
        sites: Vec<String>,
        step: f64,
        ideal: f64,
        wan_bytes_per_step: f64,
        sync: Option<(u32, u32)>,
    ) -> ModeOutcome {
        let compute_utilisation = if step > 0.0 {
            (ideal / step).min(1.0)
        } else {
            1.0
        };
        ModeOutcome {
            mode,
            sites,
            step_seconds: step,
            compute_utilisation,
            exposed_communication_seconds: (step - ideal).max(0.0),
            wan_bytes_per_step,
            inner_steps: sync.map(|s| s.0),
            bits: sync.map(|s| s.1),
            viable: compute_utilisation >= self.viable_utilisation,
        }
    }

    fn recosted(
        &self,
        mode: Mode,
        plan: &Plan,
        job: &JobSpec,
        topology: &Topology,
        free: &Topology,
    ) -> Result<ModeOutcome, String> {
        let here = recost(topology, job, &self.params, plan).map_err(|e| e.to_string())?;
        let ideal = recost(free, job, &self.params, plan).map_err(|e| e.to_string())?;
        let sites = match mode {
            Mode::Pipeline => {
                let mut sites: Vec<String> = Vec::new();
                for stage in plan.groups.iter().flat_map(|g| &g.stages) {
                    if sites.last() != Some(&stage.site) {
                        sites.push(stage.site.clone());
                    }
                }
                sites
            }
            _ => here.site_order.clone(),
        };
        let sync = here.sync.as_ref().map(|s| (s.inner_steps, s.bits()));
        let bytes = here.wan.iter().map(|w| w.bytes_per_step).sum();
        Ok(self.outcome(mode, sites, here.step.total, ideal.step.total, bytes, sync))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_CONTINENTS: &str =
        include_str!("../../deploy/examples/three-sites-two-continents.toml");
    const CAMPUSES: &str = include_str!("../../deploy/examples/two-campuses-500km.toml");
    const DENSE: &str = include_str!("../../deploy/examples/dense-400b.job.toml");
    const LLAMA: &str = include_str!("../../deploy/examples/llama-70b.job.toml");

    fn comparison(topology: &str, job: &str) -> Comparison {
        let topology = Topology::from_toml("t.toml", topology).unwrap();
        let job = JobSpec::from_toml("j.toml", job).unwrap();
        Comparison::prepare(&topology, &job, &CostParams::default()).unwrap()
    }

    fn at_km(c: &Comparison, km: f64) -> Point {
        c.at(&WanSetting {
            distance_km: Some(km),
            ..WanSetting::default()
        })
        .unwrap()
    }

    #[test]
    fn the_modes_are_the_cost_model_on_the_topology_as_given() {
        let c = comparison(CAMPUSES, LLAMA);
        let point = c.at(&WanSetting::default()).unwrap();
        let diloco = point.outcome(Mode::Diloco).unwrap();
        let plan = c.diloco.as_ref().unwrap();
        // No setting: the figures are placement's own.
        assert_eq!(diloco.step_seconds, plan.step.total);
        let pipeline = point.outcome(Mode::Pipeline).unwrap();
        assert_eq!(
            pipeline.step_seconds,
            c.pipeline.as_ref().unwrap().step.total
        );
        // Synchronous DP sends b₀ bits of every parameter every step; DiLoCo sends far less.
        let sync_dp = point.outcome(Mode::SyncDp).unwrap();
        assert!(sync_dp.wan_bytes_per_step > 100.0 * diloco.wan_bytes_per_step);
        assert!(sync_dp.step_seconds > diloco.step_seconds);
        for o in &point.outcomes {
            assert!((0.0..=1.0).contains(&o.compute_utilisation), "{o:?}");
            assert_eq!(o.viable, o.compute_utilisation >= 0.9);
        }
    }

    #[test]
    fn synchronous_dp_pays_the_full_gradient_every_step_and_falls_off_with_distance() {
        let c = comparison(TWO_CONTINENTS, DENSE);
        let near = at_km(&c, 1.0);
        let far = at_km(&c, 10_000.0);
        let (n, f) = (
            near.outcome(Mode::SyncDp).unwrap(),
            far.outcome(Mode::SyncDp).unwrap(),
        );
        // The same bytes at every distance: the gradient at the training precision,
        // 2(M−1)/M of it from every site, both directions.
        assert_eq!(n.wan_bytes_per_step, f.wan_bytes_per_step);
        assert!(f.step_seconds > n.step_seconds);
        assert!(f.compute_utilisation < n.compute_utilisation);
        // DiLoCo at 10,000 km stays far more efficient than synchronous DP.
        let d = far.outcome(Mode::Diloco).unwrap();
        assert!(d.compute_utilisation > f.compute_utilisation, "{d:?} {f:?}");
        assert!(d.inner_steps.unwrap() >= 1 && d.bits.unwrap() <= 16);
    }

    /// The closed forms behind the modes, on two sites: synchronous DP moves 2(M−1)/M of the
    /// gradient from each site each way (4·(N/2)·b₀/8 bytes over the one link, both
    /// directions), every step; DiLoCo the same at its codec's wire bits, once per H steps;
    /// and synchronous DP's step is its inner step plus that exchange, unhidden.
    #[test]
    fn on_two_sites_the_modes_are_their_closed_forms() {
        let c = comparison(CAMPUSES, LLAMA);
        let point = at_km(&c, 500.0);
        let n = c.job.model.parameters as f64;
        let b0 = f64::from(c.job.training.precision.bytes() * 8);
        let dp = point.outcome(Mode::SyncDp).unwrap();
        let expected = 4.0 * (n / 2.0) * b0 / 8.0;
        assert!(
            (dp.wan_bytes_per_step - expected).abs() <= 1e-9 * expected,
            "{} against {expected}",
            dp.wan_bytes_per_step
        );
        let diloco = point.outcome(Mode::Diloco).unwrap();
        let (h, bits) = (diloco.inner_steps.unwrap(), diloco.bits.unwrap());
        let codec = Codec::standard()
            .into_iter()
            .find(|c| c.bits == bits)
            .unwrap();
        let wire = 4.0 * (n / 2.0) * codec.bits_per_parameter() / 8.0 / f64::from(h);
        assert!(
            (diloco.wan_bytes_per_step - wire).abs() <= 1e-6 * wire,
            "{} against {wire}",
            diloco.wan_bytes_per_step
        );
        let plan = c.plan(Mode::SyncDp).unwrap();
        assert_eq!(
            plan.mode,
            longhaul_core::placement::CrossSiteMode::DataParallel
        );
        let inner = plan
            .groups
            .iter()
            .map(|g| g.step_seconds)
            .fold(0.0, f64::max);
        // Exposed on a free WAN is zero only up to the links' α; the bytes term dominates.
        assert!(dp.step_seconds > inner);
        assert!(dp.exposed_communication_seconds > 0.0);
        assert!(
            (dp.step_seconds - dp.exposed_communication_seconds - inner).abs()
                < 1e-3 * dp.step_seconds
        );
    }

    #[test]
    fn a_fixed_h_and_bits_are_what_the_diloco_figures_use() {
        let c = comparison(TWO_CONTINENTS, DENSE);
        let point = c
            .at(&WanSetting {
                inner_steps: Some(50),
                bits: Some(8),
                ..WanSetting::default()
            })
            .unwrap();
        let d = point.outcome(Mode::Diloco).unwrap();
        assert_eq!((d.inner_steps, d.bits), (Some(50), Some(8)));
        let h100 = c
            .at(&WanSetting {
                inner_steps: Some(100),
                bits: Some(8),
                ..WanSetting::default()
            })
            .unwrap();
        // Twice the inner steps between syncs: half the bytes per step.
        let d100 = h100.outcome(Mode::Diloco).unwrap();
        let ratio = d.wan_bytes_per_step / d100.wan_bytes_per_step;
        assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn a_setting_out_of_range_is_refused_naming_it() {
        let c = comparison(CAMPUSES, LLAMA);
        for (setting, field) in [
            (
                WanSetting {
                    distance_km: Some(-1.0),
                    ..WanSetting::default()
                },
                "distance_km",
            ),
            (
                WanSetting {
                    loss: Some(1.0),
                    ..WanSetting::default()
                },
                "loss",
            ),
            (
                WanSetting {
                    bits: Some(3),
                    ..WanSetting::default()
                },
                "bits",
            ),
            (
                WanSetting {
                    parallel_links: Some(0),
                    ..WanSetting::default()
                },
                "parallel_links",
            ),
        ] {
            let error = c.at(&setting).unwrap_err();
            assert!(error.to_string().contains(field), "{error}");
        }
    }
}
