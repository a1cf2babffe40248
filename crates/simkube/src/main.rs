//! The simkube command.
fn main() {}
