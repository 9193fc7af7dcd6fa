//! The embedded Shakespeare corpus (see `models/data/SHAKESPEARE.md` for its origin and
//! licence) as character ids: the vocabulary is the sorted set of its 84 distinct characters,
//! and the split is by position, the first 90% for training and the last 10% for validation.

use flate2::read::GzDecoder;
use rtx_core::{Result, RtxError};
use std::io::Read;

/// The gzip-compressed text, embedded so training needs no files at run time.
pub const SHAKESPEARE_GZ: &[u8] = include_bytes!("../data/shakespeare.txt.gz");

/// Characters in the vocabulary.
pub const VOCAB: usize = 84;
/// Fraction of the text, from its start, used for training.
pub const TRAIN_FRACTION: f64 = 0.9;

/// A character vocabulary: id `i` is the `i`-th smallest distinct character.
#[derive(Clone, Debug, PartialEq)]
pub struct Vocab {
    chars: Vec<char>,
}

impl Vocab {
    /// The sorted distinct characters of `text`.
    pub fn of(text: &str) -> Vocab {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        Vocab { chars }
    }

    pub fn len(&self) -> usize {
        self.chars.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The ids of `text`; a character outside the vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        text.chars()
            .map(|c| match self.chars.binary_search(&c) {
                Ok(i) => Ok(i as i64),
                Err(_) => Err(RtxError::Invalid(format!(
                    "the character {c:?} is not in the corpus vocabulary ({} characters: letters, digits, punctuation, space and newline)",
                    self.chars.len()
                ))),
            })
            .collect()
    }

    /// The character of `id`, `None` outside the vocabulary.
    pub fn char(&self, id: i64) -> Option<char> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.chars.get(i).copied())
    }

    /// The text of `ids`; ids outside the vocabulary are an error.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        ids.iter()
            .map(|&id| {
                self.char(id).ok_or_else(|| {
                    RtxError::Invalid(format!(
                        "token id {id} is outside the vocabulary of {} characters",
                        self.chars.len()
                    ))
                })
            })
            .collect()
    }
}

/// The corpus as ids, split for training and validation.
pub struct Corpus {
    pub vocab: Vocab,
    pub train: Vec<i64>,
    pub validation: Vec<i64>,
}

/// The embedded text, decompressed.
pub fn shakespeare_text() -> Result<String> {
    let mut text = String::new();
    GzDecoder::new(SHAKESPEARE_GZ)
        .read_to_string(&mut text)
        .map_err(|e| RtxError::Invalid(format!("the embedded Shakespeare corpus: {e}")))?;
    Ok(text)
}

/// The embedded corpus, encoded and split by characters.
pub fn load_shakespeare() -> Result<Corpus> {
    let text = shakespeare_text()?;
    let vocab = Vocab::of(&text);
    let ids = vocab.encode(&text)?;
    let cut = (ids.len() as f64 * TRAIN_FRACTION) as usize;
    let validation = ids[cut..].to_vec();
    let mut train = ids;
    train.truncate(cut);
    Ok(Corpus {
        vocab,
        train,
        validation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_has_the_documented_size_and_vocabulary() {
        let corpus = load_shakespeare().unwrap();

        assert_eq!(corpus.vocab.len(), VOCAB);
        assert_eq!(corpus.train.len() + corpus.validation.len(), 5_057_198);
        assert_eq!(corpus.train.len(), 4_551_478);
    }

    #[test]
    fn encode_and_decode_are_inverse() {
        let vocab = Vocab::of("ROMEO: hello, world\n");
        let ids = vocab.encode("hello ROMEO").unwrap();

        assert_eq!(vocab.decode(&ids).unwrap(), "hello ROMEO");
    }

    #[test]
    fn a_character_outside_the_vocabulary_is_an_error_naming_it() {
        let vocab = Vocab::of("abc");

        let err = vocab.encode("abz").unwrap_err();

        assert!(err.to_string().contains("'z'"), "{err}");
    }
}
