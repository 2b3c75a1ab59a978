//! The real models' tests, one binary (tract linked once): each model
//! served through laned's runner, every stream bit-exact with its solo run,
//! and the checked fetch.

mod common;
mod dfn;
mod dtln;
mod fetch;
mod oww;
mod silero;
