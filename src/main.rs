/// glibc's malloc took a tenth of the dispatcher's CPU time in the drain benchmark (many
/// short-lived buffers per email, freed on another thread); mimalloc does the same work in
/// less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    outboxd::cli::main()
}
