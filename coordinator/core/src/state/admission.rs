//! Admission: what a write must pass before it is proposed.
//!
//! A write that apply refuses has already been appended, replicated and
//! fsynced on every replica. So the service admits a write first
//! ([`ClusterState::admit`]): the bounds of [`crate::limits`] on every
//! string and list the command holds, then the very check apply runs,
//! against the current state. A write that passes may still be refused at
//! apply (the state moves between admission and apply: a compare-and-set
//! that lost a race, one job submitted twice at once), but a write that
//! admission refuses is never proposed.
//!
//! Admission is only as right as the state it judges against: the service
//! admits on a leader that has applied an entry of its own term (so every
//! write an earlier leader acknowledged is in the state), and a
//! compare-and-set on a revision ahead of the state only after a read
//! barrier (so a revision a client saw elsewhere is applied here).
//!
//! The bounds are admission's, not apply's: apply must give the same result
//! for a logged command in every release, so a bound added in a later
//! release cannot refuse, at replay, a command an earlier one applied.

use super::{ApplyError, ClusterState, Command, InventoryChange, Placement, Request};
use crate::config::{FieldPath, Violation};
use crate::limits::{self, check_at_most, check_entries, check_len};
use crate::topology::{DomainGroup, Site, WanLink};

impl ClusterState {
    /// Refuses, with the error apply would give or a bound it exceeds, a
    /// write that cannot apply to the state as it is now; changes nothing.
    pub fn admit(&self, request: &Request) -> Result<(), ApplyError> {
        check_bounds(&request.command)?;
        // Admission's, not apply's (see the module docs): a log that an earlier release
        // wrote may reuse an id, and must replay as it applied then.
        if let Command::PutMember { member } = &request.command
            && self.is_retired_member(member.id)
        {
            return Err(ApplyError::precondition(
                "member.id",
                format!(
                    "member {} was removed; a removed member's id is never reused",
                    member.id
                ),
            ));
        }
        // The bounds on a whole site hold for the site an inventory update leaves.
        if let Command::UpdateInventory {
            site_id, changes, ..
        } = &request.command
            && let Some(record) = self.sites.get(site_id)
        {
            let mut site = record.site.clone();
            // A change that cannot apply is refused below, by apply's own check.
            if changes
                .iter()
                .enumerate()
                .all(|(i, change)| super::apply_inventory_change(&mut site, change, i).is_ok())
            {
                let mut out = Vec::new();
                site_bounds(&FieldPath::root().key("site"), &site, &mut out);
                if let Some(first) = out.into_iter().next() {
                    return Err(ApplyError::invalid(
                        "changes",
                        format!(
                            "would leave site {} out of bounds: {} {}",
                            limits::quote(site_id),
                            first.path,
                            first.message
                        ),
                    ));
                }
            }
        }
        if let Some(expected) = request.expected_revision
            && expected != self.revision
        {
            return Err(super::stale_revision(expected, self.revision));
        }
        self.check(&request.command, self.revision + 1).map(drop)
    }
}

/// The bounds of [`crate::limits`] on `command`'s strings and lists; the
/// first exceeded, as an invalid argument naming the field.
pub fn check_bounds(command: &Command) -> Result<(), ApplyError> {
    let mut out = Vec::new();
    let root = FieldPath::root();
    let id = |path: FieldPath, value: &str, out: &mut Vec<Violation>| {
        check_len(&path, value, limits::MAX_ID_LEN, out);
    };
    match command {
        Command::RegisterSite {
            site, data_address, ..
        } => {
            site_bounds(&root.key("site"), site, &mut out);
            check_len(
                &root.key("data_address"),
                data_address,
                limits::MAX_ADDRESS_LEN,
                &mut out,
            );
        }
        Command::MarkSiteDown {
            site_id, reason, ..
        } => {
            id(root.key("site_id"), site_id, &mut out);
            check_len(
                &root.key("reason"),
                reason,
                limits::MAX_REASON_LEN,
                &mut out,
            );
        }
        Command::UpdateInventory {
            site_id, changes, ..
        } => {
            id(root.key("site_id"), site_id, &mut out);
            check_entries(
                &root.key("changes"),
                changes.len(),
                limits::MAX_INVENTORY_CHANGES,
                "changes",
                &mut out,
            );
            for (i, change) in changes.iter().enumerate() {
                let path = root.key("changes").index(i);
                match change {
                    InventoryChange::PutGroup { building, group } => {
                        id(path.key("building"), building, &mut out);
                        group_bounds(&path.key("group"), group, &mut out);
                    }
                    InventoryChange::RemoveGroup { building, group_id } => {
                        id(path.key("building"), building, &mut out);
                        id(path.key("group_id"), group_id, &mut out);
                    }
                }
            }
        }
        Command::PutLink { link } => {
            for (i, site) in link.between.iter().enumerate() {
                id(root.key("link").key("between").index(i), site, &mut out);
            }
            link_bounds(&root.key("link"), link, &mut out);
        }
        Command::RecordLinkMeasurement { site_a, site_b, .. } => {
            id(root.key("site_a"), site_a, &mut out);
            id(root.key("site_b"), site_b, &mut out);
        }
        Command::SubmitJob {
            job_id,
            spec,
            placement,
        } => {
            id(root.key("job_id"), job_id, &mut out);
            let spec_path = root.key("spec");
            id(spec_path.key("name"), &spec.name, &mut out);
            crate::job::job_bounds(&spec_path, spec, &mut out);
            let sites = spec_path.key("constraints").key("allowed_sites");
            let allowed = &spec.constraints.allowed_sites;
            for (i, site) in allowed.iter().enumerate() {
                id(sites.index(i), site, &mut out);
            }
            placement_bounds(&root.key("placement"), placement, &mut out);
        }
        Command::SetPlacement {
            job_id, placement, ..
        } => {
            id(root.key("job_id"), job_id, &mut out);
            placement_bounds(&root.key("placement"), placement, &mut out);
        }
        Command::CancelJob { job_id, .. } => id(root.key("job_id"), job_id, &mut out),
        Command::PutMember { member } => {
            let path = root.key("member");
            check_len(
                &path.key("name"),
                &member.name,
                limits::MAX_NAME_LEN,
                &mut out,
            );
            for (key, url) in [
                ("peer_url", &member.peer_url),
                ("client_url", &member.client_url),
            ] {
                if let Some(problem) = limits::url_problem(url) {
                    out.push(Violation::new(path.key(key), problem));
                }
            }
        }
        Command::RemoveMember { .. } => {}
        Command::OpenRound {
            job_id,
            participants,
            catch_up,
            fragments,
            links,
            ..
        } => {
            id(root.key("job_id"), job_id, &mut out);
            let path = root.key("participants");
            check_entries(
                &path,
                participants.len(),
                limits::MAX_SITES,
                "sites",
                &mut out,
            );
            for (i, site) in participants.iter().enumerate() {
                id(path.index(i), site, &mut out);
            }
            let path = root.key("links");
            // A full mesh of the most sites a round may have.
            check_entries(
                &path,
                links.len(),
                limits::MAX_SITES * (limits::MAX_SITES - 1) / 2,
                "links",
                &mut out,
            );
            for (i, link) in links.iter().enumerate() {
                for (j, site) in link.between.iter().enumerate() {
                    id(path.index(i).key("between").index(j), site, &mut out);
                }
            }
            let path = root.key("catch_up");
            check_entries(&path, catch_up.len(), limits::MAX_SITES, "sites", &mut out);
            for (i, c) in catch_up.iter().enumerate() {
                id(path.index(i).key("site"), &c.site, &mut out);
                id(path.index(i).key("from_site"), &c.from_site, &mut out);
            }
            if *fragments > limits::MAX_ROUND_FRAGMENTS {
                out.push(Violation::new(
                    root.key("fragments"),
                    format!(
                        "is {fragments}, more than the {} allowed",
                        limits::MAX_ROUND_FRAGMENTS
                    ),
                ));
            }
        }
        Command::ReportContributed {
            job_id, site_id, ..
        } => {
            id(root.key("job_id"), job_id, &mut out);
            id(root.key("site_id"), site_id, &mut out);
        }
        Command::ReportApplied {
            job_id,
            site_id,
            hash,
            inner_step_us,
            ..
        } => {
            id(root.key("job_id"), job_id, &mut out);
            check_at_most(
                &root.key("inner_step_us"),
                *inner_step_us,
                limits::MAX_INNER_STEP_US,
                "µs",
                &mut out,
            );
            id(root.key("site_id"), site_id, &mut out);
            check_len(&root.key("hash"), hash, limits::MAX_HASH_LEN, &mut out);
            // It is quoted in errors and round records and compared byte for
            // byte: printable ASCII without spaces (hex, base64).
            if !hash.bytes().all(|b| b.is_ascii_graphic()) {
                out.push(Violation::new(
                    root.key("hash"),
                    format!(
                        "must be printable ASCII without spaces (e.g. hex), found {}",
                        limits::quote(hash)
                    ),
                ));
            }
        }
        Command::ExcludeParticipant {
            job_id,
            site_id,
            message,
            ..
        } => {
            id(root.key("job_id"), job_id, &mut out);
            id(root.key("site_id"), site_id, &mut out);
            check_len(
                &root.key("message"),
                message,
                limits::MAX_REASON_LEN,
                &mut out,
            );
        }
        Command::ReplanSync { job_id, sync, .. } => {
            id(root.key("job_id"), job_id, &mut out);
            let path = root.key("sync");
            check_entries(
                &path.key("schedule"),
                sync.schedule.len(),
                limits::MAX_ROUND_FRAGMENTS as usize,
                "fragments",
                &mut out,
            );
            check_entries(
                &path.key("sites"),
                sync.sites.len(),
                limits::MAX_SITES,
                "sites",
                &mut out,
            );
        }
        Command::AbortRound { job_id, reason, .. } => {
            id(root.key("job_id"), job_id, &mut out);
            check_len(
                &root.key("reason"),
                reason,
                limits::MAX_REASON_LEN,
                &mut out,
            );
        }
        Command::Noop { payload } => {
            check_len(
                &root.key("payload"),
                payload,
                limits::MAX_NOOP_PAYLOAD,
                &mut out,
            );
        }
    }
    match out.into_iter().next() {
        Some(violation) => Err(ApplyError::invalid(
            violation.path.to_string(),
            violation.message,
        )),
        None => Ok(()),
    }
}

pub(crate) fn site_bounds(path: &FieldPath, site: &Site, out: &mut Vec<Violation>) {
    let before = out.len();
    check_len(&path.key("id"), &site.id, limits::MAX_ID_LEN, out);
    if let Some(name) = &site.name {
        check_len(&path.key("name"), name, limits::MAX_NAME_LEN, out);
    }
    check_entries(
        &path.key("buildings"),
        site.buildings.len(),
        limits::MAX_BUILDINGS_PER_SITE,
        "buildings",
        out,
    );
    if let Some(rate) = site.campus_interconnect {
        limits::check_rate_at_most(&path.key("campus_interconnect"), rate, out);
    }
    for (b, building) in site.buildings.iter().enumerate() {
        let path = path.key("buildings").index(b);
        check_len(&path.key("id"), &building.id, limits::MAX_ID_LEN, out);
        let fabric = path.key("fabric").key("link_rate");
        limits::check_rate_at_most(&fabric, building.fabric.link_rate, out);
        check_entries(
            &path.key("domains"),
            building.domains.len(),
            limits::MAX_GROUPS_PER_BUILDING,
            "domain groups",
            out,
        );
        for (d, group) in building.domains.iter().enumerate() {
            group_bounds(&path.key("domains").index(d), group, out);
        }
    }
    // A sum is only worth reporting when no part of it is out of bounds itself.
    if out.len() > before {
        return;
    }
    check_at_most(
        &path.key("buildings"),
        total_gpus([site]),
        limits::MAX_GPUS,
        "GPUs in all",
        out,
    );
}

/// The bounds on one WAN link: its parallel links, route length and rate.
pub(crate) fn link_bounds(path: &FieldPath, link: &WanLink, out: &mut Vec<Violation>) {
    let parallel = path.key("parallel_links");
    let max = limits::MAX_PARALLEL_LINKS;
    check_at_most(&parallel, link.parallel_links, max, "links", out);
    if link.distance.km() > limits::MAX_ROUTE_KM {
        out.push(Violation::new(
            path.key("distance"),
            format!(
                "a fibre route of {:.3e} km is longer than twice around the Earth ({} km allowed)",
                link.distance.km(),
                limits::MAX_ROUTE_KM
            ),
        ));
    }
    limits::check_rate_at_most(&path.key("link_rate"), link.link_rate, out);
}

fn group_bounds(path: &FieldPath, group: &DomainGroup, out: &mut Vec<Violation>) {
    check_len(&path.key("id"), &group.id, limits::MAX_ID_LEN, out);
    check_len(&path.key("gpu"), &group.gpu, limits::MAX_ID_LEN, out);
    for (key, value, max, what) in [
        (
            "count",
            group.count,
            limits::MAX_DOMAINS_PER_GROUP,
            "domains",
        ),
        (
            "nodes_per_domain",
            group.nodes_per_domain,
            limits::MAX_NODES_PER_DOMAIN,
            "nodes",
        ),
        (
            "gpus_per_node",
            group.gpus_per_node,
            limits::MAX_GPUS_PER_NODE,
            "GPUs",
        ),
    ] {
        check_at_most(&path.key(key), value, max, what, out);
    }
}

/// GPUs of `sites`, saturating (the sum of sites at the bounds above
/// overflows `u64`).
pub(crate) fn total_gpus<'a>(sites: impl IntoIterator<Item = &'a Site>) -> u64 {
    sites
        .into_iter()
        .flat_map(|site| &site.buildings)
        .flat_map(|building| &building.domains)
        .fold(0u64, |sum, group| {
            let per_domain =
                u64::from(group.nodes_per_domain).saturating_mul(u64::from(group.gpus_per_node));
            sum.saturating_add(u64::from(group.count).saturating_mul(per_domain))
        })
}

fn placement_bounds(path: &FieldPath, placement: &Placement, out: &mut Vec<Violation>) {
    if let Placement::Infeasible { reason } = placement {
        check_len(&path.key("reason"), reason, limits::MAX_REASON_LEN, out);
    }
}
