//! longhaul's site agent: it runs beside a campus's scheduler, registers the
//! site's inventory with the coordinator, keeps its lease alive, watches its
//! assignments and measures links to other sites.

pub mod agent;
pub mod assignment;
mod atomic;
pub mod catchup;
pub mod config;
pub mod congestion;
pub mod coordinator;
pub mod daemon;
pub mod data_endpoint;
pub mod exchange;
pub mod hostlist;
pub mod inventory;
pub mod launch;
pub mod metrics;
pub mod probe;
pub mod prober;
pub mod render;
pub mod rounds;
pub mod status;
pub mod store;
pub mod tls;
pub mod trainer;
pub mod udp;
