//! The `site-agent` binary (its commands arrive with the agent's config).

fn main() {}
