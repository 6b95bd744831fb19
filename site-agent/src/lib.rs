//! longhaul's site agent: it runs beside a campus's scheduler, registers the
//! site's inventory with the coordinator, keeps its lease alive, watches its
//! assignments and measures links to other sites.

pub mod inventory;
pub mod probe;
pub mod tls;
