//! Messages built while the compiler evaluates a constant.
//!
//! A generic model's compound shape relations (`C*H*W == FLAT`, a window that must fit `H`)
//! hold for some values of its parameters and not for others, so `graph!` checks them when
//! the model is instantiated: an associated constant of the model evaluates each relation and
//! panics with a message naming the model, the values and the op. A constant's panic message
//! can only be a `&str`, and `format!` does not run in constants, so the message is assembled
//! here, by hand, in a fixed buffer.

/// A message of at most 1 KiB assembled in a const context; text past the end is dropped.
#[derive(Clone, Copy, Debug)]
pub struct ConstMessage {
    buf: [u8; 1024],
    len: usize,
}

impl ConstMessage {
    /// An empty message.
    pub const fn new() -> ConstMessage {
        ConstMessage {
            buf: [0; 1024],
            len: 0,
        }
    }

    /// Appends `s` whole, or nothing if it does not fit (so the text stays valid UTF-8).
    pub const fn text(mut self, s: &str) -> ConstMessage {
        let bytes = s.as_bytes();
        if self.len + bytes.len() > self.buf.len() {
            return self;
        }
        let mut i = 0;
        while i < bytes.len() {
            self.buf[self.len + i] = bytes[i];
            i += 1;
        }
        self.len += bytes.len();
        self
    }

    /// Appends `v` in decimal.
    pub const fn int(mut self, v: i128) -> ConstMessage {
        let mut digits = [0u8; 40];
        let mut n = 0;
        let mut rest = v.unsigned_abs();
        loop {
            digits[n] = b'0' + (rest % 10) as u8;
            n += 1;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        if v < 0 {
            digits[n] = b'-';
            n += 1;
        }
        if self.len + n > self.buf.len() {
            return self;
        }
        while n > 0 {
            n -= 1;
            self.buf[self.len] = digits[n];
            self.len += 1;
        }
        self
    }

    /// The message so far.
    pub const fn as_str(&self) -> &str {
        match core::str::from_utf8(self.buf.split_at(self.len).0) {
            Ok(s) => s,
            // Unreachable: only whole `&str`s and ASCII digits are appended.
            Err(_) => "shape check failed",
        }
    }
}

impl Default for ConstMessage {
    fn default() -> Self {
        ConstMessage::new()
    }
}

#[cfg(test)]
mod tests {
    use super::ConstMessage;

    #[test]
    fn builds_text_and_numbers_in_a_constant() {
        const M: ConstMessage = ConstMessage::new()
            .text("K = ")
            .int(-42)
            .text(", N = ")
            .int(0);
        assert_eq!(M.as_str(), "K = -42, N = 0");
    }

    #[test]
    fn drops_text_that_does_not_fit() {
        let long = "x".repeat(1000);
        let m = ConstMessage::new().text(&long).text(&long).int(7);
        assert_eq!(m.as_str().len(), 1001);
        assert!(m.as_str().ends_with('7'));
    }
}
