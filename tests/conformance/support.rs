//! What every case shares: assertion macros that say what differed, the "rejected and changed
//! nothing" check, small fixtures, and the traits that let one case run on several backends.

use std::fmt::Debug;

use libtest_mimic::Failed;
use vmm_alloc::backend::{
    Access, Backend, CallKind, EventId, HostBackend, PhysHandle, SimBackend, StreamId,
};
use vmm_alloc::testkit::EmulatedBackend;
use vmm_alloc::{BackendError, DevAddr, VaRange};

/// What a case returns.
pub type TestResult = Result<(), Failed>;

/// A backend the generic cases can run on (every backend is cheap to clone and shares its state).
pub trait Subject: Backend + Clone + 'static {}
impl<T: Backend + Clone + 'static> Subject for T {}

/// One case of the suite, run once per backend it is registered for.
pub struct Case<B> {
    /// The test name after the backend prefix.
    pub name: &'static str,
    /// The body: gets a fresh backend, must leave it holding nothing.
    pub run: fn(&B) -> TestResult,
}

/// `cases![a, b]`: a `Vec<Case<B>>` named after the functions.
macro_rules! cases {
    ($($f:ident),* $(,)?) => {
        vec![$($crate::support::Case { name: stringify!($f), run: $f }),*]
    };
}

/// Fails the case with the message unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(::libtest_mimic::Failed::from(format!($($msg)+)));
        }
    };
}

/// Fails the case unless `actual == expected`, showing both.
macro_rules! ensure_eq {
    ($actual:expr, $expected:expr, $($msg:tt)+) => {{
        let (actual, expected) = (&$actual, &$expected);
        if actual != expected {
            return Err(::libtest_mimic::Failed::from(format!(
                "{}: expected {:?}, got {:?}",
                format_args!($($msg)+),
                expected,
                actual
            )));
        }
    }};
}

/// Unwraps a backend call that must succeed; on failure the message names the call and the error.
macro_rules! ok {
    ($call:expr) => {
        $crate::support::Ctx::ctx($call, stringify!($call))?
    };
}

/// `rejects!(b, Op, call, Pattern)`: `call` (a call of kind `CallKind::Op` on `b`) must fail with
/// an error of that kind whose `BackendErrorKind` matches `Pattern`, leave `b.live()` exactly as it
/// was, and be counted by `b.calls()` as one failed call of that kind (and nothing else).
/// Evaluates to the error.
macro_rules! rejects {
    ($b:expr, $op:ident, $call:expr, $pat:pat $(if $guard:expr)?) => {{
        let what = stringify!($call);
        let err = $crate::support::rejected($b, ::vmm_alloc::backend::CallKind::$op, what, || $call)?;
        match &err.kind {
            $pat $(if $guard)? => {}
            #[allow(unreachable_patterns)]
            other => {
                return Err(::libtest_mimic::Failed::from(format!(
                    "`{what}`: expected an error matching `{}`, got {other:?} (\"{err}\")",
                    stringify!($pat $(if $guard)?)
                )))
            }
        }
        err
    }};
}

/// Adds the failing call to a backend error.
pub trait Ctx<T> {
    /// The value, or a failure naming `what` and the error.
    fn ctx(self, what: &str) -> Result<T, Failed>;
}

impl<T> Ctx<T> for Result<T, BackendError> {
    fn ctx(self, what: &str) -> Result<T, Failed> {
        self.map_err(|e| Failed::from(format!("`{what}` failed unexpectedly: {e} [{:?}]", e.kind)))
    }
}

/// The body of [`rejects!`]: runs `call`, checks it failed as `op` and changed nothing.
pub fn rejected<B: Backend + ?Sized, T: Debug>(
    b: &B,
    op: CallKind,
    what: &str,
    call: impl FnOnce() -> Result<T, BackendError>,
) -> Result<BackendError, Failed> {
    let (live, calls) = (b.live(), b.calls());
    let result = call();
    let (live_after, calls_after) = (b.live(), b.calls());
    let err = match result {
        Ok(v) => return Err(format!("`{what}` should have failed, but returned Ok({v:?})").into()),
        Err(e) => e,
    };
    ensure!(
        err.op == op,
        "`{what}` failed as a {:?} call, expected {op:?}: {err}",
        err.op
    );
    ensure!(
        live_after == live,
        "`{what}` failed ({err}) but changed the state: before {live}; after {live_after}"
    );
    let counted = calls_after.since(&calls);
    ensure!(
        counted.calls(op) == 1 && counted.failures(op) == 1 && counted.total() == 1,
        "`{what}` should count as exactly one failed {op} call; counted: {counted}"
    );
    Ok(err)
}

/// `va.start + off`.
pub fn addr(va: VaRange, off: usize) -> DevAddr {
    va.start
        .checked_add(off)
        .expect("test offsets stay inside the address space")
}

/// Read-write access for the backend's own device.
pub fn rw<B: Backend + ?Sized>(b: &B) -> [Access; 1] {
    [Access::read_write(b.device())]
}

/// `len` recognisable, non-zero bytes; a different `seed` gives different bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i.wrapping_mul(131) ^ usize::from(seed).wrapping_mul(97)) % 251) as u8 + 1)
        .collect()
}

/// Reads `len` bytes at `at`.
pub fn read_vec<B: Backend + ?Sized>(
    b: &B,
    at: DevAddr,
    len: usize,
) -> Result<Vec<u8>, BackendError> {
    let mut out = vec![0u8; len];
    b.read(at, &mut out)?;
    Ok(out)
}

/// Fails unless the `len(expected)` bytes at `at` equal `expected`.
pub fn expect_bytes<B: Backend + ?Sized>(
    b: &B,
    at: DevAddr,
    expected: &[u8],
    what: &str,
) -> TestResult {
    let got = read_vec(b, at, expected.len())
        .ctx(&format!("read {} bytes at {at} ({what})", expected.len()))?;
    if got != expected {
        let first = got
            .iter()
            .zip(expected)
            .position(|(a, e)| a != e)
            .unwrap_or(0);
        return Err(format!(
            "{what}: the {} bytes read at {at} differ from what was written, first at byte {first}: \
             read {:#04x}, expected {:#04x}",
            expected.len(),
            got[first],
            expected[first]
        )
        .into());
    }
    Ok(())
}

/// One handle of `granules` granules mapped whole, with read-write access, at the start of a
/// reservation of the same size.
pub struct Mapped {
    pub va: VaRange,
    pub handle: PhysHandle,
    pub len: usize,
}

/// Reserves, creates, maps and grants access: the usual set-up.
pub fn map_whole<B: Backend + ?Sized>(b: &B, granules: usize) -> Result<Mapped, Failed> {
    let len = granules * b.granularity();
    let va = ok!(b.reserve(len));
    let handle = ok!(b.create(len));
    ok!(b.map(va.start, len, handle, 0));
    ok!(b.set_access(va.start, len, &rw(b)));
    Ok(Mapped { va, handle, len })
}

/// Undoes [`map_whole`].
pub fn unmap_whole<B: Backend + ?Sized>(b: &B, m: Mapped) -> TestResult {
    ok!(b.unmap(m.va.start, m.len));
    ok!(b.release(m.handle));
    ok!(b.free_reservation(m.va));
    Ok(())
}

/// A handle this backend never handed out: one made by another backend after more creates than
/// `b` has ever received (handle numbers count up per backend).
pub fn foreign_handle<B: Backend + ?Sized>(b: &B) -> Result<PhysHandle, Failed> {
    let other = SimBackend::new();
    let g = other.granularity();
    let mut last = None;
    for _ in 0..=b.calls().calls(CallKind::Create) {
        last = Some(ok!(other.create(g)));
    }
    Ok(last.expect("at least one handle is created"))
}

/// An event this backend never recorded (see [`foreign_handle`]).
pub fn foreign_event<B: Backend + ?Sized>(b: &B) -> Result<EventId, Failed> {
    let other = SimBackend::new();
    let mut last = None;
    for _ in 0..=b.calls().calls(CallKind::RecordEvent) {
        last = Some(ok!(other.record_event(StreamId::DEFAULT)));
    }
    Ok(last.expect("at least one event is recorded"))
}

/// The emulated backends (Sim and Host), with the test kit's controls: fault plans and
/// test-controlled events.
pub trait Emulated: Subject + EmulatedBackend {
    /// A new backend of this kind with its default settings.
    fn fresh() -> Result<Self, BackendError>;
    /// A new backend of this kind with room for `granules` granules of physical memory.
    fn with_granules(granules: usize) -> Result<Self, BackendError> {
        Self::with_capacity(granules * (2 << 20))
    }
}

impl Emulated for SimBackend {
    fn fresh() -> Result<Self, BackendError> {
        Ok(SimBackend::new())
    }
}

impl Emulated for HostBackend {
    fn fresh() -> Result<Self, BackendError> {
        HostBackend::new()
    }
}
