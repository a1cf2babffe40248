//! Server-side apply cases.
