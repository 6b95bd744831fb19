//! longhaul's site agent (not yet implemented): it will run beside a campus's
//! scheduler, register the site's inventory with the coordinator, keep its
//! lease alive, watch its assignments and measure links to other sites.
//! The crate exists now so the workspace has its final shape.
