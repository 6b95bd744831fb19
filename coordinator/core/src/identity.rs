//! How identities appear in certificates.
//!
//! With mutual TLS every party's certificate comes from the cluster's CA and
//! says what the party is with DNS subject alternative names (beside the
//! host names it is reached at):
//!
//! - `replica.longhaul`: a coordinator replica (raft transport, forwarding);
//! - `operator.longhaul`: an operator (membership, links, jobs);
//! - `<site-id>.site.longhaul`: the agent of that site. The coordinator
//!   accepts a request about site `a` only from a certificate that carries
//!   `a.site.longhaul`, and an agent dialling another site's agent expects
//!   that name on the server's certificate.
//!
//! One function builds and one reads each name, so that every side agrees.

/// The name a replica's certificate carries.
pub const REPLICA_NAME: &str = "replica.longhaul";
/// The name an operator's certificate carries.
pub const OPERATOR_NAME: &str = "operator.longhaul";

/// What a certificate's names let its holder be. A certificate may name
/// several roles (a test's all-in-one certificate); most name one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roles {
    pub replica: bool,
    pub operator: bool,
    /// The sites whose agent the holder is.
    pub sites: Vec<String>,
}

impl Roles {
    /// The roles that a certificate's DNS names grant.
    pub fn from_dns_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let mut roles = Roles::default();
        for name in names {
            if name == REPLICA_NAME {
                roles.replica = true;
            } else if name == OPERATOR_NAME {
                roles.operator = true;
            } else if let Some(site) = site_of_dns_name(name)
                && !roles.sites.iter().any(|s| s == site)
            {
                roles.sites.push(site.to_string());
            }
        }
        roles
    }

    /// The roles as a person reads them: "replica, site north" or "no role".
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.replica {
            parts.push("replica".to_string());
        }
        if self.operator {
            parts.push("operator".to_string());
        }
        parts.extend(self.sites.iter().map(|s| format!("site {s}")));
        if parts.is_empty() {
            "no role (it names neither replica.longhaul, operator.longhaul nor <site>.site.longhaul)"
                .to_string()
        } else {
            parts.join(", ")
        }
    }
}

/// The suffix every site name carries.
pub const SITE_NAME_SUFFIX: &str = ".site.longhaul";

/// The certificate name of site `site_id`: `<site-id>.site.longhaul`.
pub fn site_dns_name(site_id: &str) -> String {
    format!("{site_id}{SITE_NAME_SUFFIX}")
}

/// The site a certificate name stands for, if it is a site name.
pub fn site_of_dns_name(name: &str) -> Option<&str> {
    name.strip_suffix(SITE_NAME_SUFFIX)
        .filter(|id| !id.is_empty() && !id.contains('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_foreign_names_are_not_sites() {
        assert_eq!(site_dns_name("north"), "north.site.longhaul");
        assert_eq!(site_of_dns_name(&site_dns_name("north_2")), Some("north_2"));
        assert_eq!(site_of_dns_name("north.example.com"), None);
        assert_eq!(site_of_dns_name(".site.longhaul"), None);
        assert_eq!(site_of_dns_name("a.b.site.longhaul"), None);
    }

    #[test]
    fn roles_come_from_the_role_names_and_nothing_else() {
        let roles = Roles::from_dns_names(["127.0.0.1", "localhost", REPLICA_NAME]);
        assert_eq!(
            roles,
            Roles {
                replica: true,
                ..Roles::default()
            }
        );
        let agent = Roles::from_dns_names(["north.site.longhaul", "north.site.longhaul"]);
        assert_eq!(agent.sites, vec!["north".to_string()]);
        assert!(!agent.replica && !agent.operator);
        assert_eq!(agent.describe(), "site north");
        // Look-alikes grant nothing.
        let none = Roles::from_dns_names(["replica.longhaul.example", "xoperator.longhaul"]);
        assert_eq!(none, Roles::default());
        assert!(none.describe().starts_with("no role"));
    }
}
