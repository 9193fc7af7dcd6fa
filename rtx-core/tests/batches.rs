//! Next-token batches over a token stream.

use rtx_core::batches::TokenBatches;

fn stream(n: i64) -> Vec<i64> {
    (0..n).collect()
}

#[test]
fn targets_are_the_inputs_shifted_by_one_token() {
    let tokens = stream(21);
    let b = TokenBatches::new(&tokens, 5, 3).unwrap();
    assert_eq!(b.windows(), 4);
    let batches = b.sequential().unwrap();
    assert_eq!(batches.len(), 2);
    let (x, y) = &batches[0];
    assert_eq!(x.shape(), &[3, 5]);
    let (x, y) = (x.to_vec_i64().unwrap(), y.to_vec_i64().unwrap());
    assert_eq!(&x[..5], &[0, 1, 2, 3, 4]);
    assert_eq!(&y[..5], &[1, 2, 3, 4, 5]);
    assert_eq!(&x[5..10], &[5, 6, 7, 8, 9]);
    assert_eq!(
        batches[1].0.shape(),
        &[1, 5],
        "the last batch holds what is left"
    );
}

#[test]
fn a_shuffled_epoch_visits_every_window_once_and_repeats_with_its_seed() {
    let tokens = stream(101);
    let b = TokenBatches::new(&tokens, 10, 4).unwrap();
    let firsts = |seed| -> Vec<i64> {
        b.shuffled(seed)
            .unwrap()
            .iter()
            .flat_map(|(x, _)| {
                x.to_vec_i64()
                    .unwrap()
                    .chunks(10)
                    .map(|w| w[0])
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let (a, again, other) = (firsts(7), firsts(7), firsts(8));
    assert_eq!(a, again);
    assert_ne!(a, other);
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..10).map(|w| w * 10).collect::<Vec<_>>());
}

#[test]
fn a_stream_shorter_than_one_window_is_an_error() {
    let tokens = stream(5);
    assert!(TokenBatches::new(&tokens, 5, 2).is_err());
    assert!(TokenBatches::new(&tokens, 0, 2).is_err());
    assert!(TokenBatches::new(&tokens, 2, 0).is_err());
}
