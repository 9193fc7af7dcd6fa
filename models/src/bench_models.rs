//! Models that exist only for `models bench`: a wider MLP and two parameter-free "kernels"
//! (an elementwise chain and a square matmul), all written in the DSL so the benchmark times
//! what a user's model would run: the generated code, `run_op` and the CPU kernels.

use rtx_core::prelude::*;

/// 64-1024-1024-10 perceptron with ReLU between layers. No dropout, unlike `Mlp`: the point of
/// this bench is GEMM-dominated training, and leaving dropout out keeps the PyTorch peer in
/// `scripts/bench_peers.py` a plain Linear/ReLU stack.
#[model]
pub struct WideMlp {
    fc1: Linear<64, 1024>,
    fc2: Linear<1024, 1024>,
    fc3: Linear<1024, 10>,
}

#[model]
impl WideMlp {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            self.fc3(relu(self.fc2(relu(self.fc1(x)))))
        }

        fn loss<B>(&self, x: [B, 64], y: i64[B]) -> [] {
            cross_entropy(self.forward(x), y)
        }
    }
}

/// Parameter-free graph functions used as micro-benchmarks of single ops or op chains.
#[model]
pub struct BenchKernels {}

#[model]
impl BenchKernels {
    graph! {
        // Five elementwise ops (mul, add, relu, mul, sub) with scalar constants. Today each
        // is its own kernel call writing a fresh buffer; a fusing compiler would make it one
        // pass over x, which is what the effective-bandwidth figure of the bench measures.
        fn chain<N>(&self, x: [N]) -> [N] {
            relu(x * 2.0 + 1.0) * 0.5 - 0.25
        }

        // Square f32 matmul through the DSL: one `MatMul` node, contiguous row-major inputs.
        fn square_matmul<N>(&self, a: [N, N], b: [N, N]) -> [N, N] {
            matmul(a, b)
        }
    }
}
