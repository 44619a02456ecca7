//! The binary: `outboxd::main`, with mimalloc as the global allocator.

/// glibc's malloc took a tenth of the dispatcher's CPU time in the drain benchmark (many
/// short-lived buffers per email, freed on another thread); mimalloc does the same work in
/// less. Built with `no_thp`: by default mimalloc asks the kernel for transparent huge
/// pages on its arenas, which doubled peak RSS (2 MiB at a time) and zeroed a huge page on
/// some claims (BENCHMARKS.md, *Peak memory*).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    outboxd::main()
}
