//! Scheduling of the process's own threads.

/// Lower the calling thread's scheduling priority to the Linux nice value
/// `niceness` (threads it spawns inherit it); 0 leaves it as it is. Best
/// effort: where it cannot be set (another OS, a value out of range), the
/// thread runs as it is.
pub fn lower_priority(niceness: i32) {
    if niceness <= 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no preconditions; setpriority only reads its
    // arguments, and a failure is reported through its return value.
    unsafe {
        let tid = libc::gettid();
        if libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, niceness) != 0 {
            tracing::debug!(niceness, "cannot lower the priority of this thread");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = niceness;
}
