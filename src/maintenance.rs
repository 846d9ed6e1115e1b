//! Work beside the live path: removing old inbox rows (`retention`), applying parked dead
//! letters once their cause is fixed (`redrive`), and moving a group's positions on an
//! operator's word (`positions`).
//!
//! Invariant: neither takes the live path's locks for long: retention deletes in small batches
//! outside the dedup window it guards, and a redrive applies each dead letter exactly once,
//! marking it, never deleting it; a position an operator moves is recorded with the reason.

pub mod positions;
pub mod redrive;
pub mod retention;
