//! `tetherd gateway --namespace NS`: the gateway driven by the objects the controller writes in
//! a tenant namespace instead of a file.

pub mod fabric;
pub mod run;
pub mod status;
pub mod translate;
