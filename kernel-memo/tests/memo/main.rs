//! kernel-memo's integration tests, one binary, a module per topic.

mod memo_props;
mod seed_bug;
