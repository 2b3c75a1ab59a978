//! Prove, for any model, that serving it through lanes changes nothing for
//! any stream.
pub mod fixtures;
