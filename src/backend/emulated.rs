//! What the two emulated backends (Sim and Host) share beyond the rule checker: simulated events
//! in their raw devices, and the test controls (fault plans, held streams) of `testkit`.

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

/// Implements [`crate::testkit::EmulatedBackend`] (feature `testkit`) for a public backend type
/// whose `inner` is an `Arc<Checked<R>>` and whose raw device `R` has an `events: SimEvents`
/// field, and whose `with_config` takes a `$config` with a `capacity`.
macro_rules! emulated_controls {
    ($ty:ty, $config:ident) => {
        #[cfg(feature = "testkit")]
        impl $crate::testkit::EmulatedBackend for $ty {
            fn with_capacity(capacity: usize) -> Result<Self, $crate::backend::BackendError> {
                Self::with_config($config {
                    capacity,
                    ..$config::default()
                })
            }

            fn set_faults(&self, plan: $crate::testkit::FaultPlan) {
                self.inner.set_faults(plan);
            }

            fn clear_faults(&self) -> u64 {
                self.inner
                    .set_faults($crate::testkit::FaultPlan::new())
                    .fired()
            }

            fn faults_fired(&self) -> u64 {
                self.inner.faults_fired()
            }

            fn hold_stream(&self, stream: $crate::backend::StreamId) {
                self.inner.with_raw(|raw| raw.events.hold(stream));
            }

            fn release_stream(&self, stream: $crate::backend::StreamId) {
                self.inner.with_raw(|raw| raw.events.release_stream(stream));
            }

            fn stream_generation(&self, stream: $crate::backend::StreamId) -> u64 {
                self.inner.with_raw(|raw| raw.events.generation(stream))
            }

            fn complete_event(&self, event: $crate::backend::EventId) -> bool {
                match self.inner.raw_event(event) {
                    Some(raw) => self.inner.with_raw(|r| r.events.complete(raw)),
                    None => false,
                }
            }

            fn pending_events(&self, stream: $crate::backend::StreamId) -> usize {
                self.inner.with_raw(|raw| raw.events.pending(stream))
            }

            fn capacity(&self) -> usize {
                self.inner.capacity()
            }
        }
    };
}
pub(crate) use emulated_controls;
