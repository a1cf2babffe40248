//! Strategic merge patch cases.
