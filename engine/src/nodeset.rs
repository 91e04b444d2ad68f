//! A fixed-size bitset of node ids; iteration is always in ascending id order.

use crate::ids::NodeId;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSet {
    words: Vec<u64>,
    len: usize,
}

impl NodeSet {
    pub fn new(capacity: usize) -> NodeSet {
        NodeSet {
            words: vec![0; capacity.div_ceil(64)],
            len: 0,
        }
    }

    /// Room for ids below `capacity` (a node added to a running engine).
    pub fn grow(&mut self, capacity: usize) {
        let words = capacity.div_ceil(64);
        if words > self.words.len() {
            self.words.resize(words, 0);
        }
    }

    pub fn insert(&mut self, n: NodeId) -> bool {
        let (w, b) = (n.index() / 64, n.index() % 64);
        let fresh = self.words[w] & (1 << b) == 0;
        self.words[w] |= 1 << b;
        self.len += fresh as usize;
        fresh
    }

    pub fn remove(&mut self, n: NodeId) -> bool {
        let (w, b) = (n.index() / 64, n.index() % 64);
        let was = self.words[w] & (1 << b) != 0;
        self.words[w] &= !(1 << b);
        self.len -= was as usize;
        was
    }

    pub fn contains(&self, n: NodeId) -> bool {
        let (w, b) = (n.index() / 64, n.index() % 64);
        self.words.get(w).is_some_and(|x| x & (1 << b) != 0)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Members in ascending id order.
    pub fn iter(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros();
                w &= w - 1;
                Some(NodeId((wi * 64) as u32 + b))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_iterate_in_order() {
        let mut s = NodeSet::new(200);
        for i in [130u32, 3, 64, 199, 0] {
            assert!(s.insert(NodeId(i)));
        }
        assert!(!s.insert(NodeId(3)));
        assert_eq!(s.len(), 5);
        let v: Vec<u32> = s.iter().map(|n| n.0).collect();
        assert_eq!(v, vec![0, 3, 64, 130, 199]);
        assert!(s.remove(NodeId(64)));
        assert!(!s.remove(NodeId(64)));
        assert!(!s.contains(NodeId(64)) && s.contains(NodeId(199)));
        assert_eq!(s.len(), 4);
        s.grow(300);
        assert!(s.insert(NodeId(299)) && s.contains(NodeId(199)));
        assert_eq!(s.iter().last(), Some(NodeId(299)));
        assert_eq!(s.len(), 5);
    }
}
