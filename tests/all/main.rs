//! The allocator tests: one integration binary (faster to link than one per file).

mod alias_rescue;
mod best_fit_growth;
mod classic_behaviour;
mod classic_model;
mod drain_after_sync;
mod expandable_behaviour;
mod expandable_pressure;
mod expandable_regressions;
mod expandable_rollback;
mod fine_pages;
mod foreign_frees;
mod front_cache;
mod front_engage;
mod fuzz_found;
mod give_back_before_foreign_sync;
mod harvest_order;
mod hopeless_growth;
mod last_free;
mod model;
mod parked_pages;
mod pytorch_parity;
mod pytorch_rounding;
mod scaling_regressions;
mod stream_pages;
mod unmap_runs;
mod va_budget;
