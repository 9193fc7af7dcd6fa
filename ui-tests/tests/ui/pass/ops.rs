//! Most ops of graph! in one model, with an embedding, a layer norm and a raw `Param2`.
use rtx_core::prelude::*;

#[model]
pub struct Zoo {
    emb: Embedding<50, 16>,
    ln: LayerNorm<16>,
    w: Param2<16, 16>,
    fc: Linear<32, 16>,
}

#[model]
impl Zoo {
    graph! {
        fn forward<B, T>(&self, ids: i64[B, T]) -> [B, T, 16] {
            let h = self.ln(self.emb(ids));                              // [B, T, 16]
            let a = matmul(h, self.w);                                   // [B, T, 16]
            let s = matmul(a, transpose(h, 1, 2));                       // [B, T, T]
            let causal = masked_fill(s, triu(s * 0.0 + 1.0, 1), -1e9);   // future masked
            let scores = softmax(causal, -1);                            // [B, T, T]
            let ctx = matmul(scores, h);                                 // [B, T, 16]
            let y = self.fc(concat([ctx, gelu(a)], 2));                  // [B, T, 16]
            let heads = permute(reshape(y, [B, T, 4, 4]), [0, 2, 1, 3]); // [B, 4, T, 4]
            let back = reshape(permute(heads, [0, 2, 1, 3]), [B, T, -1]); // -1 inferred: 16
            tanh(back) + sigmoid(y) * 0.5
        }

        fn stats<B, T>(&self, ids: i64[B, T]) -> [B] {
            let y = self.forward(ids);                  // [B, T, 16]
            let pos = exp(narrow(y, 2, 0, 8));          // [B, T, 8]
            let s = sum(log(pos + 1.0), 2);             // [B, T]
            let m = mean(sqrt(pow(s, 2.0) + 1.0), 1);   // [B]
            m - max(y, [1, 2])
        }

        fn loss<B, T>(&self, ids: i64[B, T], target: [B, T, 16]) -> [] {
            mse(self.forward(ids), target)
        }
    }
}

fn main() {
    let m = Zoo::init(0);
    let ids = Tensor::from_i64(vec![1, 5, 49, 0, 3, 3], &[2, 3]).unwrap();
    assert_eq!(m.forward(&ids).unwrap().shape(), &[2, 3, 16]);
    let s = m.stats(&ids).unwrap();
    assert_eq!(s.shape(), &[2]);
    assert!(s.to_vec_f32().unwrap().iter().all(|v| v.is_finite()));

    let target = Tensor::zeros(&[2, 3, 16]);
    let (loss, grads) = m.loss_and_grads(&mut Ctx::eval(), &ids, &target).unwrap();
    assert!(loss.item().unwrap() >= 0.0);
    assert_eq!(grads.len(), 6);
    assert_eq!(grads.get("w").unwrap().shape(), &[16, 16]);
    assert_eq!(grads.get("emb.weight").unwrap().shape(), &[50, 16]);
    assert_eq!(grads.get("ln.weight").unwrap().shape(), &[16]);
}
