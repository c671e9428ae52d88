//! The allocator of dedupq's binaries: jemalloc, installed by
//! [`allocator!`](crate::allocator!) in each binary's `main.rs`, for Rust's
//! allocations (the C libraries keep glibc's `malloc`: see Cargo.toml).
//! The library itself installs none, so an embedder keeps its own.
//!
//! glibc's allocator locks the owning arena for every block freed on
//! another thread than the one that allocated it, and tokio moves tasks
//! (and what they allocated) between its worker threads: on the Kafka path
//! malloc and free were about 30% of the process's CPU. With jemalloc the
//! process spends 12–17% less CPU per message (BENCHMARKS.md, "The
//! allocator").

pub use tikv_jemallocator::Jemalloc;

/// The type of [`CONF`]: a C string of jemalloc options.
pub type Conf = [u8; 36];

/// jemalloc's options, compiled in (it reads them before the first
/// allocation; `_RJEM_MALLOC_CONF` in the environment still overrides
/// them): pages left unused for half a second go back to the system, so
/// that a burst does not keep its memory. With jemalloc's default of ten
/// seconds the 16-partition bench row peaked 10–15 MB higher, past its
/// 150 MB bound.
pub const CONF: &Conf = b"dirty_decay_ms:500,muzzy_decay_ms:0\0";

/// Installs jemalloc, with [`CONF`], as the global allocator of the binary
/// that calls it (once, at the top level of `main.rs`).
#[macro_export]
macro_rules! allocator {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::allocator::Jemalloc = $crate::allocator::Jemalloc;

        /// Read by jemalloc under this C name (its symbols carry the `_rjem_`
        /// prefix).
        #[export_name = "_rjem_malloc_conf"]
        static MALLOC_CONF: &$crate::allocator::Conf = $crate::allocator::CONF;
    };
}

#[cfg(test)]
mod tests {
    use super::CONF;

    #[test]
    fn the_options_are_one_c_string() {
        let (last, text) = CONF.split_last().expect("empty");
        assert_eq!(*last, 0, "jemalloc reads up to a NUL");
        assert!(!text.contains(&0), "a NUL inside cuts the options short");
        let text = std::str::from_utf8(text).expect("ASCII");
        for option in text.split(',') {
            let (name, value) = option.split_once(':').expect("name:value");
            assert!(!name.is_empty() && !value.is_empty(), "{option}");
        }
    }
}
