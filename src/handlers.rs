//! The handlers that ship with the processor: the ledger (`ledger`: balances that refuse
//! overdrafts, the reference) and the handler made of one SQL statement (`sql_handler`).
//!
//! Invariant: a handler works only in the batch's transaction it is given, on the new messages
//! it is given; the trait they implement is the pipeline's (`pipeline::handler`).

pub mod ledger;
pub(crate) mod sql_handler;
