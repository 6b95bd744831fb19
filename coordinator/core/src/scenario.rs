//! Rehearsal scenarios: a topology, a job, link impairments and a timeline of
//! faults to play against the real coordinator and agents.
//!
//! A scenario names its topology and job files by path (relative to the
//! scenario file); reading them is the caller's business, since the core does
//! no I/O. [`Scenario::violations_against`] checks the references once the
//! topology is loaded.

use serde::{Deserialize, Serialize};

use crate::config::{self, ConfigError, FieldPath, Validate, Violation, check_id};
use crate::topology::{Topology, WanLink};
use crate::units::{DataRate, Duration};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    /// Seed of every random choice in the rehearsal; printed in reports.
    #[serde(default)]
    pub seed: u64,
    /// Topology file, relative to the scenario file.
    pub topology: String,
    /// Job file, relative to the scenario file.
    pub job: String,
    /// How long the rehearsal runs after the job is placed.
    pub duration: Duration,
    #[serde(default)]
    pub coordinator: CoordinatorPlacement,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub impairments: Vec<Impairment>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelineEvent>,
    #[serde(default, skip_serializing_if = "ScenarioExchange::is_default")]
    pub exchange: ScenarioExchange,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<ScenarioTraining>,
}

/// Real trainers instead of synthetic pseudo-gradients: a trainer process
/// per site of the job, started once the job is placed, that talks to its
/// site's agent through the local trainer API. Each gets the environment
/// `LONGHAUL_TRAINER_SOCKET`, `LONGHAUL_JOB`, `LONGHAUL_SITE`,
/// `LONGHAUL_SEED` and `LONGHAUL_OUTPUT` (a JSON file the report reads);
/// the rehearsal ends when every trainer has exited, or at `duration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioTraining {
    /// The program and its arguments, e.g.
    /// `["python3", "-m", "longhaul.examples.chars", "--steps", "600"]`.
    pub command: Vec<String>,
}

/// Longest trainer command line.
pub const MAX_TRAINING_ARGS: usize = 64;

/// What the agents exchange in the job's outer rounds (a job placed as
/// DiLoCo replicas): a synthetic, seeded pseudo-gradient per fragment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScenarioExchange {
    /// f32 values each agent contributes per fragment; 0 turns the
    /// exchange off. Default 262,144 (1 MiB), at most 2^28.
    pub elements: u64,
    /// QUIC connections in each agent's pool to each peer (and in the
    /// simulator's beside it), between 1 and
    /// [`MAX_EXCHANGE_CONNECTIONS`]; the agents' default (4) when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<u32>,
}

/// Largest synthetic fragment of a rehearsal.
pub const MAX_EXCHANGE_ELEMENTS: u64 = 1 << 28;

/// Most connections per peer of a rehearsal's agents: the agents' own
/// bound (`longhaul_site_agent::exchange::MAX_CONNECTIONS_PER_PEER`, which
/// the rehearsal checks is the same).
pub const MAX_EXCHANGE_CONNECTIONS: u32 = 64;

impl Default for ScenarioExchange {
    fn default() -> Self {
        Self {
            elements: 1 << 18,
            connections: None,
        }
    }
}

impl ScenarioExchange {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Where the coordinator replicas run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorPlacement {
    /// Number of replicas: 1, 3 or 5.
    #[serde(default = "three")]
    pub replicas: u32,
    /// The site of each replica; empty puts them all in the first site.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<String>,
}

fn three() -> u32 {
    3
}

impl Default for CoordinatorPlacement {
    fn default() -> Self {
        Self {
            replicas: three(),
            sites: Vec::new(),
        }
    }
}

/// Impairments of one WAN link, on top of its configured figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Impairment {
    #[serde(deserialize_with = "crate::topology::site_pair")]
    pub link: [String; 2],
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<DataRate>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// SIGKILL the coordinator leader.
    KillLeader,
    /// Restart every killed coordinator replica.
    RestartCoordinators,
    /// Cut every link of a site.
    Partition,
    /// Restore a partitioned site.
    Heal,
    /// Kill a site's agent.
    KillAgent,
    /// Restart a site's agent.
    RestartAgent,
    /// Change a link's loss rate.
    SetLoss,
    /// Change a link's rate.
    SetRate,
}

impl Action {
    fn needs_site(self) -> bool {
        matches!(
            self,
            Self::Partition | Self::Heal | Self::KillAgent | Self::RestartAgent
        )
    }
    fn needs_link(self) -> bool {
        matches!(self, Self::SetLoss | Self::SetRate)
    }
}

/// One step of the fault timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineEvent {
    /// Time since the job was placed.
    pub at: Duration,
    pub action: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::topology::site_pair_opt"
    )]
    pub link: Option<[String; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<DataRate>,
}

impl Scenario {
    pub fn from_toml(file: &str, text: &str) -> Result<Self, ConfigError> {
        config::parse(file, text)
    }

    /// The impairments of the link `wan`, in the order given.
    pub fn impairments_of<'a>(&'a self, wan: &'a WanLink) -> impl Iterator<Item = &'a Impairment> {
        self.impairments
            .iter()
            .filter(|i| wan.joins(&i.link[0], &i.link[1]))
    }

    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// References to sites and links that the topology does not have.
    pub fn violations_against(&self, topology: &Topology) -> Vec<Violation> {
        let mut out = Vec::new();
        let root = FieldPath::root();
        let site_known = |id: &str| topology.site(id).is_some();
        for (i, site) in self.coordinator.sites.iter().enumerate() {
            if !site_known(site) {
                out.push(Violation::new(
                    root.key("coordinator").key("sites").index(i),
                    format!("unknown site {site:?} in topology {:?}", topology.name),
                ));
            }
        }
        let mut check_link = |path: FieldPath, link: &[String; 2]| {
            if topology.link(&link[0], &link[1]).is_none() {
                out.push(Violation::new(
                    path,
                    format!(
                        "topology {:?} has no link between {:?} and {:?}",
                        topology.name, link[0], link[1]
                    ),
                ));
            }
        };
        for (i, impairment) in self.impairments.iter().enumerate() {
            check_link(
                root.key("impairments").index(i).key("link"),
                &impairment.link,
            );
        }
        for (i, event) in self.timeline.iter().enumerate() {
            if let Some(link) = &event.link {
                check_link(root.key("timeline").index(i).key("link"), link);
            }
        }
        for (i, event) in self.timeline.iter().enumerate() {
            if let Some(site) = &event.site
                && !site_known(site)
            {
                out.push(Violation::new(
                    root.key("timeline").index(i).key("site"),
                    format!("unknown site {site:?} in topology {:?}", topology.name),
                ));
            }
        }
        out
    }
}

fn check_loss(path: FieldPath, loss: Option<f64>, out: &mut Vec<Violation>) {
    if let Some(loss) = loss
        && !(loss.is_finite() && (0.0..1.0).contains(&loss))
    {
        out.push(Violation::new(
            path,
            format!("must be a probability in [0, 1) (write 1% as 0.01), found {loss}"),
        ));
    }
}

impl Validate for Scenario {
    fn violations(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        let root = FieldPath::root();
        check_id(&root.key("name"), &self.name, &mut out);
        for key in ["topology", "job"] {
            let value = if key == "topology" {
                &self.topology
            } else {
                &self.job
            };
            if value.trim().is_empty() {
                out.push(Violation::new(root.key(key), "must name a file"));
            }
        }
        if self.duration.as_nanos() == 0 {
            out.push(Violation::new(
                root.key("duration"),
                "must be a positive duration, found 0",
            ));
        }
        if self.exchange.elements > MAX_EXCHANGE_ELEMENTS {
            out.push(Violation::new(
                root.key("exchange").key("elements"),
                format!(
                    "is {}; at most {MAX_EXCHANGE_ELEMENTS} (1 GiB of f32 per fragment)",
                    self.exchange.elements
                ),
            ));
        }
        if let Some(n) = self.exchange.connections
            && !(1..=MAX_EXCHANGE_CONNECTIONS).contains(&n)
        {
            out.push(Violation::new(
                root.key("exchange").key("connections"),
                format!("is {n}; it must be between 1 and {MAX_EXCHANGE_CONNECTIONS}"),
            ));
        }
        if let Some(training) = &self.training {
            let at = root.key("training").key("command");
            if training.command.first().is_none_or(|c| c.trim().is_empty()) {
                out.push(Violation::new(at, "must name a program to run"));
            } else if training.command.len() > MAX_TRAINING_ARGS
                || training
                    .command
                    .iter()
                    .any(|a| a.len() > 4096 || a.contains('\0'))
            {
                out.push(Violation::new(
                    at,
                    format!(
                        "at most {MAX_TRAINING_ARGS} arguments of at most 4096 bytes, without NUL"
                    ),
                ));
            }
        }
        let replicas = self.coordinator.replicas;
        if !matches!(replicas, 1 | 3 | 5) {
            out.push(Violation::new(
                root.key("coordinator").key("replicas"),
                format!("must be 1, 3 or 5 replicas, found {replicas}"),
            ));
        }
        let sites = self.coordinator.sites.len();
        if sites != 0 && sites != replicas as usize {
            out.push(Violation::new(
                root.key("coordinator").key("sites"),
                format!(
                    "lists {sites} sites for {replicas} replicas: give one site per replica or none"
                ),
            ));
        }
        for (i, impairment) in self.impairments.iter().enumerate() {
            let path = root.key("impairments").index(i);
            check_loss(path.key("loss"), impairment.loss, &mut out);
            if impairment.rate.is_some_and(|r| r.bits_per_second() == 0) {
                out.push(Violation::new(
                    path.key("rate"),
                    "must be a positive data rate, found 0",
                ));
            }
        }
        for (i, event) in self.timeline.iter().enumerate() {
            let path = root.key("timeline").index(i);
            let action = serde_name(event.action);
            if event.at > self.duration {
                out.push(Violation::new(
                    path.key("at"),
                    format!(
                        "event at {} is after the scenario ends ({})",
                        event.at, self.duration
                    ),
                ));
            }
            if event.action.needs_site() {
                match &event.site {
                    None => out.push(Violation::new(
                        path.clone(),
                        format!("action {action:?} needs `site`"),
                    )),
                    Some(site) => check_id(&path.key("site"), site, &mut out),
                }
            } else if event.site.is_some() {
                out.push(Violation::new(
                    path.key("site"),
                    format!("action {action:?} takes no `site`"),
                ));
            }
            if event.action.needs_link() != event.link.is_some() {
                let message = if event.link.is_some() {
                    format!("action {action:?} takes no `link`")
                } else {
                    format!("action {action:?} needs `link`")
                };
                out.push(Violation::new(path.key("link"), message));
            }
            match event.action {
                Action::SetLoss if event.loss.is_none() => {
                    out.push(Violation::new(
                        path.clone(),
                        "action \"set-loss\" needs `loss`",
                    ));
                }
                Action::SetRate if event.rate.is_none() => {
                    out.push(Violation::new(
                        path.clone(),
                        "action \"set-rate\" needs `rate`",
                    ));
                }
                _ => {}
            }
            check_loss(path.key("loss"), event.loss, &mut out);
        }
        out
    }
}

fn serde_name(action: Action) -> String {
    toml::Value::try_from(action)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
