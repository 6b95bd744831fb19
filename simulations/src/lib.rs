//! longhaul's network emulator and simulator (not yet implemented): a sans-IO
//! link model shared by a real-time proxy and a discrete-event simulator, and
//! the rehearsal harness. The crate exists now so the workspace has its final
//! shape.
