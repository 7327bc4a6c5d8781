//! The review side of the daemon, apart from the commit path: what a change would do before
//! it is merged. [`plans`] plans every watched ref against the branch, [`publish`] puts each
//! plan on the forge (a comment and a commit status), [`previews`] runs a labelled pull
//! request's changed steps beside production. None of them moves what runs: only the
//! followed branch's commits reach the workers and the cutover engine.

pub mod plans;
pub mod previews;
pub mod publish;
