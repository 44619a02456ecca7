fn main() -> std::process::ExitCode {
    outboxd::cli::main()
}
