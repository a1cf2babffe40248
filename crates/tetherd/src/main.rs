//! The tetherd command.
fn main() {}
