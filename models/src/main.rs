//! `models`: train the DSL models on the embedded 8x8 digits.
//!
//! `cargo run --release` trains the default model (the MLP); `models train --model cnn
//! --epochs 20 --seed 7 --save cnn.safetensors` picks the rest; `models bench` times the
//! framework (see `models/src/bench.rs` and `BENCHMARKS.md`).

use clap::{Parser, Subcommand, ValueEnum};
use models::cnn::Cnn;
use models::mlp::Mlp;
use models::train::{Classifier, TrainConfig, TrainReport, held_out_accuracy, train};
use rtx_core::prelude::*;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "models",
    about = "Train RustyTorch++ models on the embedded 8x8 digits data set"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model and report its held-out accuracy.
    Train {
        #[arg(long, value_enum, default_value_t = Which::Mlp)]
        model: Which,
        /// Training epochs (default: the model's own).
        #[arg(long)]
        epochs: Option<usize>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Write the trained weights to this safetensors file.
        #[arg(long)]
        save: Option<PathBuf>,
    },
    /// Load weights from a safetensors file and report held-out accuracy.
    Eval {
        #[arg(long, value_enum, default_value_t = Which::Mlp)]
        model: Which,
        #[arg(long)]
        load: PathBuf,
    },
    /// Print the graph IR the compiler built for a model (forward and backward nodes).
    Graph {
        #[arg(long, value_enum, default_value_t = Which::Mlp)]
        model: Which,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Time training steps, inference, an elementwise chain and GEMM; one
    /// `bench=<name> key=value ...` line per result.
    Bench {
        /// Run only the benchmarks whose name contains this string.
        #[arg(long)]
        filter: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
    Dot,
}

#[derive(Clone, Copy, ValueEnum)]
enum Which {
    Mlp,
    Cnn,
}

fn run<M: Classifier>(cfg: &TrainConfig, save: Option<PathBuf>) -> Result<TrainReport> {
    println!("training {} on the 8x8 digits (seed {})", M::NAME, cfg.seed);
    let (model, report) = train::<M>(cfg)?;
    println!("parameters: {}", model.num_params());
    if let Some(path) = save {
        model.save_safetensors(&path)?;
        println!("saved weights to {}", path.display());
    }
    Ok(report)
}

fn eval<M: Classifier>(path: &Path) -> Result<()> {
    let mut model = M::init(0);
    model.load_safetensors(path)?;
    let accuracy = held_out_accuracy(&model)?;
    println!(
        "eval: model={} weights={} test_accuracy={accuracy:.4}",
        M::NAME,
        path.display()
    );
    Ok(())
}

fn print_graph(ir: rtx_core::ir::ModelIr, format: Format) -> Result<()> {
    match format {
        Format::Text => print!("{}", ir.to_text()),
        Format::Dot => print!("{}", ir.to_dot()),
        Format::Json => println!("{}", ir.to_json().map_err(RtxError::Invalid)?),
    }
    Ok(())
}

fn train_and_report(which: Which, cfg: &TrainConfig, save: Option<PathBuf>) -> Result<()> {
    let r = match which {
        Which::Mlp => run::<Mlp>(cfg, save),
        Which::Cnn => run::<Cnn>(cfg, save),
    }?;
    println!(
        "final: model={} test_accuracy={:.4} epochs={} seconds={:.1}",
        r.model, r.test_accuracy, r.epochs, r.seconds
    );
    Ok(())
}

fn main() -> ExitCode {
    // Before anything starts rayon's pool, so this thread becomes one of its workers.
    rtx_core::parallel::join_pool_from_main();
    let cli = Cli::parse();
    let result = match cli.command {
        None => train_and_report(
            Which::Mlp,
            &TrainConfig {
                epochs: None,
                seed: 0,
                progress: true,
                verbose: true,
            },
            None,
        ),
        Some(Command::Train {
            model,
            epochs,
            seed,
            save,
        }) => train_and_report(
            model,
            &TrainConfig {
                epochs,
                seed,
                progress: true,
                verbose: true,
            },
            save,
        ),
        Some(Command::Eval {
            model: Which::Mlp,
            load,
        }) => eval::<Mlp>(&load),
        Some(Command::Eval {
            model: Which::Cnn,
            load,
        }) => eval::<Cnn>(&load),
        Some(Command::Graph {
            model: Which::Mlp,
            format,
        }) => Mlp::graph().and_then(|ir| print_graph(ir, format)),
        Some(Command::Graph {
            model: Which::Cnn,
            format,
        }) => Cnn::graph().and_then(|ir| print_graph(ir, format)),
        Some(Command::Bench { filter }) => models::bench::run(filter.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
