//! The testkit's integration tests, one binary (tract linked once), a
//! module per topic.

mod by_hand;
mod from_file;
mod odd_models;
