//! What the two emulated backends (Sim and Host) share beyond the rule checker: simulated events
//! in their raw devices, and the test controls (fault plans, held streams) on their public types.

/// Expands, inside an `impl RawDevice for X` whose `X` has an `events: SimEvents` field, to the
/// stream and event methods backed by it.
macro_rules! sim_event_methods {
    () => {
        fn knows_stream(&self, _stream: $crate::backend::StreamId) -> bool {
            true
        }
        fn record_event(&mut self, stream: $crate::backend::StreamId) -> RawResult<RawEvent> {
            Ok(self.events.record(stream))
        }
        fn query_event(&mut self, event: RawEvent) -> RawResult<bool> {
            Ok(self.events.query(event))
        }
        fn release_event(&mut self, event: RawEvent) -> RawResult<()> {
            self.events.release(event);
            Ok(())
        }
        fn synchronize(&mut self, stream: $crate::backend::StreamId) -> RawResult<()> {
            self.events.synchronize(stream);
            Ok(())
        }
    };
}
pub(crate) use sim_event_methods;

/// Adds the test controls to a public backend type whose `inner` is an `Arc<Checked<R>>` and
/// whose raw device `R` has an `events: SimEvents` field.
macro_rules! emulated_controls {
    ($ty:ty) => {
        impl $ty {
            /// Installs a fault plan (replacing any previous one, whose call counting restarts).
            pub fn set_faults(&self, plan: $crate::backend::FaultPlan) {
                self.inner.set_faults(plan);
            }

            /// Removes the fault plan; returns how many faults it injected.
            pub fn clear_faults(&self) -> u64 {
                self.inner
                    .set_faults($crate::backend::FaultPlan::new())
                    .fired()
            }

            /// Faults injected so far by the current plan.
            pub fn faults_fired(&self) -> u64 {
                self.inner.faults_fired()
            }

            /// From now on, events recorded on `stream` stay pending (its "work" is still running).
            pub fn hold_stream(&self, stream: $crate::backend::StreamId) {
                self.inner.with_raw(|raw| raw.events.hold(stream));
            }

            /// Stops holding `stream` and completes its pending events.
            pub fn release_stream(&self, stream: $crate::backend::StreamId) {
                self.inner.with_raw(|raw| raw.events.release_stream(stream));
            }

            /// How many times every event of `stream` was completed at once, by `synchronize` or
            /// by [`Self::release_stream`]: a test can tell that a stream's work is known to be done.
            pub fn stream_generation(&self, stream: $crate::backend::StreamId) -> u64 {
                self.inner.with_raw(|raw| raw.events.generation(stream))
            }

            /// Completes one pending event; false if it is not live.
            pub fn complete_event(&self, event: $crate::backend::EventId) -> bool {
                match self.inner.raw_event(event) {
                    Some(raw) => self.inner.with_raw(|r| r.events.complete(raw)),
                    None => false,
                }
            }

            /// Events recorded on `stream` that have not completed.
            pub fn pending_events(&self, stream: $crate::backend::StreamId) -> usize {
                self.inner.with_raw(|raw| raw.events.pending(stream))
            }
        }
    };
}
pub(crate) use emulated_controls;
