//! How a site's identity appears in certificates.
//!
//! An agent's certificate names its site with a DNS subject alternative name
//! `<site-id>.site.longhaul`. The coordinator accepts a request about site
//! `a` only from a client whose certificate carries `a.site.longhaul`, and an
//! agent dialling another site's agent expects that name on the server's
//! certificate. One function builds the name so that both sides agree.

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
}
