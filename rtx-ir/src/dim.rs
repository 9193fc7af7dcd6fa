//! Dimensions as symbolic integer expressions.
//!
//! A dimension is a polynomial with integer coefficients over three kinds of atoms: run-time
//! symbols (`B`, `T`: bound when a graph is entered), generic parameters (`IN`: a const generic
//! of the model, known after monomorphization) and floor divisions of a non-constant polynomial
//! by a constant (what a conv output size over a symbolic height leaves behind). Keeping a
//! normal form makes equality structural: `C*H*W` built by flatten equals `H*W*C` built by hand.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// An indivisible factor of a monomial.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Atom {
    /// Bound at run time from the inputs (`B`).
    Sym(String),
    /// A const generic parameter of the model (`IN`).
    Param(String),
    /// `floor(numerator / divisor)` where the numerator is not a constant.
    FloorDiv(Box<Dim>, u64),
}

/// A dimension: `sum(coeff * product(atoms))` in normal form (no zero coefficients, atoms
/// sorted within a monomial).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(into = "DimTerms", from = "DimTerms")]
pub struct Dim {
    terms: BTreeMap<Vec<Atom>, i64>,
}

impl Dim {
    pub fn known(n: usize) -> Dim {
        // Sizes past i64::MAX cannot be real; saturate so a corrupt file cannot wrap them.
        Dim::constant(i64::try_from(n).unwrap_or(i64::MAX))
    }

    pub fn constant(n: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if n != 0 {
            terms.insert(Vec::new(), n);
        }
        Dim { terms }
    }

    pub fn sym(name: &str) -> Dim {
        Dim::atom(Atom::Sym(name.to_string()))
    }

    pub fn param(name: &str) -> Dim {
        Dim::atom(Atom::Param(name.to_string()))
    }

    fn atom(a: Atom) -> Dim {
        let mut terms = BTreeMap::new();
        terms.insert(vec![a], 1);
        Dim { terms }
    }

    /// The value when the dimension is a plain constant.
    pub fn as_const(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    pub fn as_known(&self) -> Option<usize> {
        self.as_const().and_then(|v| usize::try_from(v).ok())
    }

    pub fn is_one(&self) -> bool {
        self.as_const() == Some(1)
    }

    /// True when the dimension mentions a run-time symbol.
    pub fn has_sym(&self) -> bool {
        self.atoms().iter().any(|a| matches!(a, Atom::Sym(_)))
    }

    /// True when the dimension mentions a generic parameter.
    pub fn has_param(&self) -> bool {
        self.atoms().iter().any(|a| matches!(a, Atom::Param(_)))
    }

    /// Every atom, including those inside floor divisions.
    pub fn atoms(&self) -> Vec<Atom> {
        let mut out = Vec::new();
        for mono in self.terms.keys() {
            for a in mono {
                if let Atom::FloorDiv(inner, _) = a {
                    out.extend(inner.atoms());
                }
                out.push(a.clone());
            }
        }
        out
    }

    /// A single symbol or parameter, if that is all the dimension is.
    pub fn as_single_atom(&self) -> Option<&Atom> {
        if self.terms.len() != 1 {
            return None;
        }
        let (mono, coeff) = self.terms.iter().next()?;
        if *coeff == 1 && mono.len() == 1 {
            mono.first()
        } else {
            None
        }
    }

    pub fn add(&self, other: &Dim) -> Dim {
        let mut terms = self.terms.clone();
        for (m, c) in &other.terms {
            let t = terms.entry(m.clone()).or_insert(0);
            *t = t.saturating_add(*c);
        }
        terms.retain(|_, c| *c != 0);
        Dim { terms }
    }

    pub fn sub(&self, other: &Dim) -> Dim {
        self.add(&other.scale(-1))
    }

    pub fn scale(&self, k: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if k != 0 {
            for (m, c) in &self.terms {
                terms.insert(m.clone(), c.saturating_mul(k));
            }
        }
        Dim { terms }
    }

    pub fn mul(&self, other: &Dim) -> Dim {
        let mut terms: BTreeMap<Vec<Atom>, i64> = BTreeMap::new();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut m = ma.clone();
                m.extend(mb.iter().cloned());
                m.sort();
                let t = terms.entry(m).or_insert(0);
                *t = t.saturating_add(ca.saturating_mul(*cb));
            }
        }
        terms.retain(|_, c| *c != 0);
        Dim { terms }
    }

    /// `floor(self / d)`; exact when every coefficient divides, opaque otherwise.
    pub fn floor_div(&self, d: u64) -> Dim {
        // Arithmetic saturates rather than overflows: dimensions read from a file can hold
        // anything, and a saturated size is refused later instead of panicking here.
        let Ok(di) = i64::try_from(d) else {
            return Dim::atom(Atom::FloorDiv(Box::new(self.clone()), d));
        };
        if d == 1 {
            return self.clone();
        }
        if d == 0 {
            // Has no value: evaluating it fails with an error.
            return Dim::atom(Atom::FloorDiv(Box::new(self.clone()), d));
        }
        if let Some(c) = self.as_const() {
            return Dim::constant(c.div_euclid(di));
        }
        if self.terms.values().all(|c| c % di == 0) {
            let mut terms = BTreeMap::new();
            for (m, c) in &self.terms {
                terms.insert(m.clone(), c / di);
            }
            return Dim { terms };
        }
        Dim::atom(Atom::FloorDiv(Box::new(self.clone()), d))
    }

    /// Evaluates with every symbol and parameter taken from `env`; `None` if one is missing.
    pub fn eval(&self, env: &HashMap<String, i64>) -> Option<i64> {
        let mut total = 0i64;
        for (mono, coeff) in &self.terms {
            let mut v = *coeff;
            for a in mono {
                v = v.checked_mul(eval_atom(a, env)?)?;
            }
            total = total.checked_add(v)?;
        }
        Some(total)
    }

    /// `self / divisor` when it is exact for every value of the atoms: the divisor is one
    /// monomial (`4*B`) that divides every term of `self` (`64*B*T` gives `16*T`). `None`
    /// otherwise, also when a quotient may exist but is not a polynomial over these atoms.
    pub fn exact_div(&self, divisor: &Dim) -> Option<Dim> {
        if self == divisor {
            return Some(Dim::known(1));
        }
        let mut dterms = divisor.terms.iter();
        let (datoms, &dcoeff) = dterms.next()?;
        if dterms.next().is_some() || dcoeff <= 0 {
            return None;
        }
        let mut terms = BTreeMap::new();
        for (mono, &c) in &self.terms {
            if c % dcoeff != 0 {
                return None;
            }
            let mut rest = mono.clone();
            for a in datoms {
                let at = rest.iter().position(|r| r == a)?;
                rest.remove(at);
            }
            terms.insert(rest, c / dcoeff);
        }
        Some(Dim { terms })
    }

    /// The product of the run-time symbols that every monomial holds (`B*T` in
    /// `B*T*D - 4*B*T*E`), as a dimension with coefficient 1; `None` when the monomials hold
    /// different symbols, or a symbol sits inside a floor division.
    pub fn common_symbol_factor(&self) -> Option<Dim> {
        let syms = |mono: &[Atom]| -> Vec<Atom> {
            mono.iter()
                .filter(|a| matches!(a, Atom::Sym(_)))
                .cloned()
                .collect()
        };
        let mut monos = self.terms.keys();
        let common = monos.next().map(|m| syms(m)).unwrap_or_default();
        if monos.any(|m| syms(m) != common) {
            return None;
        }
        let mut terms = BTreeMap::new();
        terms.insert(common, 1);
        let factor = Dim { terms };
        let rest = self.exact_div(&factor)?;
        (!rest.has_sym()).then_some(factor)
    }

    /// True when the dimension cannot be zero for any positive values of its atoms: no floor
    /// division, and every coefficient of one sign (`IN`, `2*IN - 0`, `-HID - 3`).
    pub fn never_zero(&self) -> bool {
        let no_floor = self
            .atoms()
            .iter()
            .all(|a| !matches!(a, Atom::FloorDiv(..)));
        let positive = self.terms.values().all(|&c| c > 0);
        let negative = self.terms.values().all(|&c| c < 0);
        !self.terms.is_empty() && no_floor && (positive || negative)
    }

    /// Monomials with their coefficients, for code generation.
    pub fn terms(&self) -> impl Iterator<Item = (&[Atom], i64)> {
        self.terms.iter().map(|(m, c)| (m.as_slice(), *c))
    }
}

/// JSON has only string map keys, so a dim serializes as its list of `(atoms, coeff)` terms.
#[derive(Serialize, Deserialize)]
struct DimTerms(Vec<(Vec<Atom>, i64)>);

impl From<Dim> for DimTerms {
    fn from(d: Dim) -> DimTerms {
        DimTerms(d.terms.into_iter().collect())
    }
}

impl From<DimTerms> for Dim {
    fn from(t: DimTerms) -> Dim {
        // Re-normalize: a hand-edited file may repeat or zero a term.
        let mut d = Dim::default();
        for (mut atoms, c) in t.0 {
            atoms.sort();
            let t = d.terms.entry(atoms).or_insert(0);
            *t = t.saturating_add(c);
        }
        d.terms.retain(|_, c| *c != 0);
        d
    }
}

fn eval_atom(a: &Atom, env: &HashMap<String, i64>) -> Option<i64> {
    match a {
        Atom::Sym(n) | Atom::Param(n) => env.get(n).copied(),
        Atom::FloorDiv(inner, d) => {
            let d = i64::try_from(*d).ok().filter(|&d| d > 0)?;
            inner.eval(env)?.checked_div_euclid(d)
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::known(n)
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Sym(n) | Atom::Param(n) => write!(f, "{n}"),
            // `floor((H - 1) / 2)`: integer division, written so it cannot be misread.
            Atom::FloorDiv(inner, d) if inner.terms.len() > 1 => {
                write!(f, "floor(({inner}) / {d})")
            }
            Atom::FloorDiv(inner, d) => write!(f, "floor({inner} / {d})"),
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return write!(f, "0");
        }
        // Symbolic terms first, constant last: `H + 2`, not `2 + H`.
        let mut parts: Vec<(&Vec<Atom>, i64)> = self.terms.iter().map(|(m, c)| (m, *c)).collect();
        parts.sort_by_key(|(m, _)| m.is_empty());
        for (i, (mono, coeff)) in parts.iter().enumerate() {
            let neg = *coeff < 0;
            let mag = coeff.unsigned_abs();
            if i == 0 {
                if neg {
                    write!(f, "-")?;
                }
            } else {
                write!(f, " {} ", if neg { "-" } else { "+" })?;
            }
            if mono.is_empty() {
                write!(f, "{mag}")?;
            } else {
                if mag != 1 {
                    write!(f, "{mag}*")?;
                }
                let names: Vec<String> = mono.iter().map(|a| a.to_string()).collect();
                write!(f, "{}", names.join("*"))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_are_equal_in_any_order() {
        let a = Dim::param("C").mul(&Dim::param("H")).mul(&Dim::param("W"));
        let b = Dim::param("W").mul(&Dim::param("C")).mul(&Dim::param("H"));
        assert_eq!(a, b);
    }

    #[test]
    fn conv_size_of_constant_folds() {
        let h = Dim::known(8)
            .add(&Dim::known(2))
            .sub(&Dim::known(3))
            .floor_div(1)
            .add(&Dim::known(1));
        assert_eq!(h.as_known(), Some(8));
    }

    #[test]
    fn floor_div_of_symbol_stays_symbolic_and_evaluates() {
        let h = Dim::sym("H")
            .sub(&Dim::known(3))
            .floor_div(2)
            .add(&Dim::known(1));
        let env = HashMap::from([("H".to_string(), 9)]);
        assert_eq!(h.eval(&env), Some(4));
        assert_eq!(h.to_string(), "floor((H - 3) / 2) + 1");
    }

    #[test]
    fn exact_division_by_a_monomial() {
        let b = Dim::sym("B");
        let numel = b.mul(&Dim::sym("T")).scale(64);
        assert_eq!(numel.exact_div(&b.scale(4)), Some(Dim::sym("T").scale(16)));
        assert_eq!(numel.exact_div(&b.scale(5)), None);
        assert_eq!(numel.exact_div(&Dim::sym("C")), None);
        assert_eq!(numel.exact_div(&numel), Some(Dim::known(1)));
    }

    #[test]
    fn display_reads_like_source() {
        assert_eq!(Dim::sym("B").to_string(), "B");
        assert_eq!(Dim::param("C").mul(&Dim::known(4)).to_string(), "4*C");
        assert_eq!(Dim::known(64).to_string(), "64");
    }
}
