/* Training checkpoints as pieces: every rank writes the parameters and AdamW moments it owns
 * into its own safetensors file (rank_RRRRR.safetensors in the step directory), each piece a
 * box of one global tensor (offset and extent per dimension), with the tensor's global shape
 * in the metadata. Loading fills whatever a rank of any layout needs from the pieces of all
 * files, so a checkpoint saved at one DP degree / ZeRO stage / tensor-parallel view resumes at
 * another. See docs/checkpoints.md. */
#ifndef LOOM_CKPT_PIECES_H
#define LOOM_CKPT_PIECES_H

#include "loom/checkpoint.h"
#include "loom/parallel.h"

/* "rank_00003.safetensors" */
/* 1 for a piece file's name (rank_*.safetensors): what an inference load defers */
int loom_pieces_is_file(const char *name);
void loom_pieces_file_name(int rank, char *buf, size_t size);
/* One safetensors buffer holding the pieces: each loom_dp_piece (a flat range of the rank's
 * box of a tensor) cut into boxes of the global tensor, tensor "<kind>/<tensor>/<o0>,<o1>"
 * (F32, shape = the box's extents), metadata "format" = "loom-pieces-2" and "shape/<tensor>" =
 * "[d0, d1]" (global). */
int loom_pieces_serialize(const loom_dp_piece *p, int n, char **buf, size_t *len, loom_err *err);
/* Fills every needed piece from the piece files of an opened checkpoint (loom-pieces-2 boxes,
 * or loom-pieces-1 flat ranges of whole tensors, older checkpoints, read as boxes). Every
 * needed element must be covered exactly once and every tensor's recorded shape must match;
 * errors name the file and the tensor. Tensors of the fused format (qkv_w, qkv_b, llama fc_w)
 * fill the split ones (docs/checkpoints.md). */
int loom_pieces_fill(const loom_ckpt *ck, loom_dp_piece *needed, int n, loom_err *err);
/* Piece files the checkpoint deferred (loom_ckpt_open_ex) are read once each, front to back,
 * through their SHA-256: the needed byte ranges go straight into the pieces' memory, the rest
 * (the other kinds, other ranks' boxes) is hashed and dropped. On a failed check the pieces'
 * memory holds unverified bytes: the caller discards it (an error is returned). */
/* Loads the parameters of a checkpoint into a model that has its own arenas. */
int loom_pieces_load_params(const loom_ckpt *ck, loom_model *m, loom_err *err);

#endif
