//! What the integration tests share: provider stand-ins and an engine rig.

#![allow(dead_code)] // Each test binary uses its own part of this module.

pub mod aws;
pub mod rig;
pub mod stand_in;
