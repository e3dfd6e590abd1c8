//! `cargo run -p berth-bench --release --example bench -- fanin --uri …`:
//! the `berth bench` command line until the CLI carries it.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "bench",
    about = "berth bench: the seed experiments against any AMQP 0-9-1 broker"
)]
struct Cli {
    #[command(flatten)]
    bench: berth_bench::BenchArgs,
}

fn main() -> std::process::ExitCode {
    match berth_bench::run(Cli::parse().bench) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            std::process::ExitCode::FAILURE
        }
    }
}
