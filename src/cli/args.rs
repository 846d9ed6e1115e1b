//! The flags the binary shares with the load tools: the library's (`batch_inbox::internals::flags`).

pub use batch_inbox::internals::flags::*;
