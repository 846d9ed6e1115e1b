//! The pipeline: a partition's records, as a source delivers them (module `source`), batched
//! (`batcher`), decoded (`message`), applied by the partition's worker (`worker`) through the
//! business trait (`handler`) in one inbox transaction per batch (`inbox`, `dead_letter`), with
//! the partition's position in the database (`source::positions`) and, once committed,
//! acknowledged to the source (`offsets`); `defaults` holds every default of the processor. No
//! broker's type appears here.
//!
//! Invariant: the handler sees only new messages and only the batch's transaction; dedup,
//! effect, dead letters and position commit together; a position moves past a record only after
//! the COMMIT that covers every record before it.

pub(crate) mod batcher;
pub(crate) mod dead_letter;
pub mod defaults;
pub(crate) mod handler;
pub(crate) mod inbox;
pub(crate) mod message;
pub(crate) mod offsets;
pub(crate) mod worker;
