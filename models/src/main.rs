//! `models`: train the DSL models on the embedded 8x8 digits.
//!
//! `cargo run --release` trains the default model (the MLP); `models train --model cnn
//! --epochs 20 --seed 7 --save cnn.safetensors` picks the rest; `models bench` times the
//! framework (see `models/src/bench.rs` and `BENCHMARKS.md`).

use clap::{Parser, Subcommand, ValueEnum};
use models::cnn::Cnn;
use models::corpus::{Vocab, load_shakespeare, shakespeare_text};
use models::generate::{Sampling, generate};
use models::gpt::{CONTEXT, Gpt};
use models::mlp::Mlp;
use models::plot::{plot_curve, read_curve};
use models::train::{Classifier, TrainConfig, TrainReport, held_out_accuracy, train};
use models::train_gpt::{GptConfig, mean_loss, train_gpt};
use rtx_core::batches::TokenBatches;
use rtx_core::prelude::*;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "models",
    about = "Train RustyTorch++ models: an MLP and a CNN on the embedded 8x8 digits, a character-level GPT on the embedded Shakespeare"
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
        /// gpt: optimizer steps (the cosine schedule spans them).
        #[arg(long)]
        steps: Option<usize>,
        /// gpt: stop after this many seconds of training (evaluation excluded).
        #[arg(long)]
        max_seconds: Option<f64>,
        /// gpt: sequences per batch.
        #[arg(long)]
        batch: Option<usize>,
        /// gpt: peak learning rate.
        #[arg(long)]
        lr: Option<f32>,
        /// gpt: validate every this many steps.
        #[arg(long)]
        eval_every: Option<usize>,
        /// gpt: validation batches per evaluation (default: the whole validation split).
        #[arg(long)]
        eval_batches: Option<usize>,
        /// gpt: write the loss curve (step, seconds, train and validation loss) here, and
        /// its plot next to it (the same name, `.png`).
        #[arg(long, default_value = "gpt_loss.csv")]
        csv: PathBuf,
        /// gpt: save a training checkpoint here (weights, optimizer state, step, RNG state,
        /// data position) every --checkpoint-every steps and at the end.
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// gpt: steps between training checkpoints.
        #[arg(long, default_value_t = 500)]
        checkpoint_every: usize,
        /// gpt: continue the run saved in this training checkpoint (same settings); it
        /// takes exactly the steps the uninterrupted run would have taken.
        #[arg(long)]
        resume: Option<PathBuf>,
        /// gpt: stop after this step (the schedule still spans --steps); resume later.
        #[arg(long)]
        stop_after: Option<usize>,
        /// Mixed precision: matmul, linear, conv and attention operands and results in bf16
        /// or f16 (f32 accumulation, f32 master weights; f16 with dynamic loss scaling).
        #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
        precision: PrecisionArg,
        /// Where training runs. `wgpu` (a binary built with `--features wgpu`)
        /// runs every step on the first GPU wgpu finds (Mesa's llvmpipe without one);
        /// `cuda` (built with `--features cuda`) on the first CUDA GPU.
        #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
        device: DeviceArg,
    },
    /// Load weights from a safetensors file and report held-out accuracy.
    Eval {
        #[arg(long, value_enum, default_value_t = Which::Mlp)]
        model: Which,
        #[arg(long)]
        load: PathBuf,
    },
    /// Continue a prompt with a trained GPT (`train --model gpt --save gpt.safetensors`),
    /// printing each character as it is drawn.
    Generate {
        #[arg(long)]
        checkpoint: PathBuf,
        #[arg(long, default_value = "ROMEO:")]
        prompt: String,
        #[arg(long, default_value_t = 500)]
        max_tokens: usize,
        #[arg(long, default_value_t = 0.8)]
        temperature: f32,
        #[arg(long)]
        top_k: Option<usize>,
        #[arg(long)]
        top_p: Option<f32>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
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
enum DeviceArg {
    Cpu,
    Wgpu,
    /// The first CUDA GPU (`Device::cuda(0)`).
    Cuda,
    /// The first AMD GPU, through HIP (`Device::hip(0)`).
    Hip,
}

impl DeviceArg {
    fn open(self) -> rtx_core::Result<Device> {
        match self {
            DeviceArg::Cpu => Ok(Device::Cpu),
            #[cfg(feature = "wgpu")]
            DeviceArg::Wgpu => {
                let device = Device::wgpu()?;
                println!("device: {device}");
                Ok(device)
            }
            #[cfg(not(feature = "wgpu"))]
            DeviceArg::Wgpu => Err(RtxError::Invalid(
                "this binary was built without the `wgpu` feature; run `cargo run --release -p models --features wgpu -- train --device wgpu`".into(),
            )),
            #[cfg(feature = "cuda")]
            DeviceArg::Cuda => {
                let device = Device::cuda(0)?;
                println!("device: {device}");
                Ok(device)
            }
            #[cfg(not(feature = "cuda"))]
            DeviceArg::Cuda => Err(RtxError::Invalid(
                "this binary was built without the `cuda` feature; run `cargo run --release -p models --features cuda -- train --device cuda`".into(),
            )),
            #[cfg(feature = "hip")]
            DeviceArg::Hip => {
                let device = Device::hip(0)?;
                println!("device: {device}");
                Ok(device)
            }
            #[cfg(not(feature = "hip"))]
            DeviceArg::Hip => Err(RtxError::Invalid(
                "this binary was built without the `hip` feature; run `cargo run --release -p models --features hip -- train --device hip`".into(),
            )),
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
    Dot,
}

#[derive(Clone, Copy, ValueEnum)]
enum PrecisionArg {
    F32,
    Bf16,
    F16,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Precision {
        match p {
            PrecisionArg::F32 => Precision::F32,
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::F16 => Precision::F16,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Which {
    Mlp,
    Cnn,
    /// Character-level transformer on the embedded Shakespeare corpus.
    Gpt,
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

fn eval_gpt(path: &Path) -> Result<()> {
    let mut model = Gpt::init(0);
    model.load_safetensors(path)?;
    let corpus = load_shakespeare()?;
    let batches = TokenBatches::new(&corpus.validation, CONTEXT, 32)?.sequential()?;
    let loss = mean_loss(&model, &batches)?;
    println!(
        "eval: model=gpt weights={} val_loss={loss:.4}",
        path.display()
    );
    Ok(())
}

fn generate_text(path: &Path, prompt: &str, max_tokens: usize, s: &Sampling) -> Result<()> {
    use std::io::Write;
    let mut model = Gpt::init(0);
    model.load_safetensors(path)?;
    let vocab = Vocab::of(&shakespeare_text()?);
    // Written without `print!`, which panics when stdout is closed early (`| head`).
    let mut stdout = std::io::stdout();
    let _ = write!(stdout, "{prompt}");
    generate(&model, &vocab, prompt, max_tokens, s, |c| {
        let _ = write!(stdout, "{c}");
        let _ = stdout.flush();
    })?;
    let _ = writeln!(stdout);
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

fn train_gpt_and_report(cfg: &GptConfig, save: Option<PathBuf>) -> Result<()> {
    println!(
        "training gpt on the embedded Shakespeare corpus (seed {}, {} steps, batch {}, {} products)",
        cfg.seed,
        cfg.steps,
        cfg.batch,
        cfg.precision.name()
    );
    if let Some(path) = &cfg.resume {
        println!("resuming from {}", path.display());
    }
    let (model, r) = train_gpt(cfg)?;
    if let Some(table) = rtx_core::profile::report(r.steps as u64) {
        eprintln!("{table}");
    }
    println!("parameters: {}", model.num_params());
    for p in &r.curve {
        println!(
            "step {:>6} seconds {:>7.1} train_loss {:.4} val_loss {:.4}",
            p.step,
            p.seconds,
            p.train_loss,
            p.val_loss.unwrap_or(f32::NAN)
        );
    }
    if let Some(path) = &cfg.csv {
        println!("loss curve: {}", path.display());
        // The model is trained whatever happens here: a plot that fails is a warning.
        let png = path.with_extension("png");
        match read_curve(path).and_then(|rows| plot_curve(&rows, &png, "gpt on Shakespeare")) {
            Ok(()) => println!("loss plot: {}", png.display()),
            Err(e) => eprintln!("warning: no loss plot: {e}"),
        }
    }
    if cfg.precision == Precision::F16 {
        println!(
            "f16 loss scaling: {} of {} steps skipped (gradient overflow)",
            r.skipped_steps, r.steps
        );
    }
    if let Some(path) = &cfg.checkpoint {
        println!("training checkpoint (step {}): {}", r.steps, path.display());
    }
    if let Some(path) = save {
        model.save_safetensors(&path)?;
        println!("saved weights to {}", path.display());
    }
    println!(
        "final: model=gpt val_loss={:.4} tokens_per_s={:.0} seconds={:.1}",
        r.val_loss, r.tokens_per_s, r.seconds
    );
    Ok(())
}

fn train_and_report(which: Which, cfg: &TrainConfig, save: Option<PathBuf>) -> Result<()> {
    let r = match which {
        Which::Mlp => run::<Mlp>(cfg, save),
        Which::Cnn => run::<Cnn>(cfg, save),
        Which::Gpt => {
            return Err(RtxError::Invalid(
                "the gpt is trained by `models train --model gpt`".into(),
            ));
        }
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
                precision: Precision::F32,
                device: Device::Cpu,
            },
            None,
        ),
        Some(Command::Train {
            model: Which::Gpt,
            seed,
            save,
            steps,
            max_seconds,
            batch,
            lr,
            eval_every,
            eval_batches,
            csv,
            checkpoint,
            checkpoint_every,
            resume,
            stop_after,
            precision,
            device,
            ..
        }) => device.open().and_then(|device| {
            let d = GptConfig::default();
            train_gpt_and_report(
                &GptConfig {
                    steps: steps.unwrap_or(d.steps),
                    max_seconds: max_seconds.or(d.max_seconds),
                    batch: batch.unwrap_or(d.batch),
                    lr: lr.unwrap_or(d.lr),
                    eval_every: eval_every.unwrap_or(d.eval_every).max(1),
                    eval_batches,
                    seed,
                    csv: Some(csv),
                    progress: true,
                    checkpoint,
                    checkpoint_every: checkpoint_every.max(1),
                    resume,
                    stop_after,
                    precision: precision.into(),
                    device,
                    ..d
                },
                save,
            )
        }),
        Some(Command::Train {
            model,
            epochs,
            seed,
            save,
            precision,
            device,
            ..
        }) => device.open().and_then(|device| {
            train_and_report(
                model,
                &TrainConfig {
                    epochs,
                    seed,
                    progress: true,
                    verbose: true,
                    precision: precision.into(),
                    device,
                },
                save,
            )
        }),
        Some(Command::Eval {
            model: Which::Mlp,
            load,
        }) => eval::<Mlp>(&load),
        Some(Command::Eval {
            model: Which::Cnn,
            load,
        }) => eval::<Cnn>(&load),
        Some(Command::Eval {
            model: Which::Gpt,
            load,
        }) => eval_gpt(&load),
        Some(Command::Graph {
            model: Which::Mlp,
            format,
        }) => Mlp::graph().and_then(|ir| print_graph(ir, format)),
        Some(Command::Graph {
            model: Which::Cnn,
            format,
        }) => Cnn::graph().and_then(|ir| print_graph(ir, format)),
        Some(Command::Graph {
            model: Which::Gpt,
            format,
        }) => Gpt::graph().and_then(|ir| print_graph(ir, format)),
        Some(Command::Bench { filter }) => models::bench::run(filter.as_deref()),
        Some(Command::Generate {
            checkpoint,
            prompt,
            max_tokens,
            temperature,
            top_k,
            top_p,
            seed,
        }) => generate_text(
            &checkpoint,
            &prompt,
            max_tokens,
            &Sampling {
                temperature,
                top_k,
                top_p,
                seed,
            },
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
