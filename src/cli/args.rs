//! The flags the binary shares with the load tools: the library's (`batch_inbox::flags`).

pub use batch_inbox::flags::*;
