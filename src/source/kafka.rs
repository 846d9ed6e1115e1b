//! The Kafka source: the group member and its partition queues (`consumer`), where an assigned
//! partition starts (`resume`: the database's position), the topic ids that tie the stored
//! positions to one topic (`topic_id`), and when `--exit-on-eof` may exit (`drain`).
//!
//! Invariant: offsets are stored for Kafka only after the COMMIT that covers them, and an
//! assigned partition starts at the database's position when the database holds one.

pub(crate) mod consumer;
pub(crate) mod drain;
pub(crate) mod resume;
pub(crate) mod topic_id;
