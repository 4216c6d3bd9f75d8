//! The loom models of the allocators' front end (`models.rs`), which need their own build:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release --test loom
//! ```
//!
//! A plain `cargo test` compiles none of them; it runs the one ignored test below instead, so its
//! summary reads "1 ignored" with the command that runs the models, not a silent "0 passed".

#[cfg(loom)]
mod models;

/// Stands in for the models in a build without `--cfg loom`: ignored, so the run says why it
/// checked nothing (the models are in `models.rs`; `.ci/run` runs them on every landing).
#[cfg(not(loom))]
#[test]
#[ignore = "the loom models run only in their own build: RUSTFLAGS=\"--cfg loom\" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release --test loom (.ci/run does)"]
fn loom_models_need_cfg_loom() {
    panic!("the loom models are compiled only with RUSTFLAGS=\"--cfg loom\"");
}
