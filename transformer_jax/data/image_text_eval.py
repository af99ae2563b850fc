"""What a dual encoder's embeddings score on held-out data, in NumPy (float32 embeddings in, plain
floats out): zero-shot classification and image-text retrieval.

Zero-shot classification (Radford et al. 2021, sec. 3.1.4): each class is embedded as the mean of
its prompts (every template filled with the class name), each prompt's embedding L2-normalised
first and the mean normalised again; an image is classified by its cosine similarity to each
class. Retrieval (the COCO protocol of Karpathy & Fei-Fei 2015, as CLIP reports it): an image is
retrieved at K when any of its captions is among the K texts most similar to it, a caption when
its image is among the K images most similar to it. A tie with the right answer counts for it
(the answer's rank is the number of candidates scored strictly higher).
"""
import numpy as np

__all__ = ['class_embeddings', 'normalized', 'retrieval_recalls', 'top_k_accuracies']


def normalized(x: np.ndarray) -> np.ndarray:
  """Each row over its L2 norm, in float32."""
  x = np.asarray(x, np.float32)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def class_embeddings(prompt_embeddings: np.ndarray, num_classes: int) -> np.ndarray:
  """(C, D) unit class embeddings from the (C * P, D) embeddings of C classes' P prompts each,
  class by class: the mean of each class's normalised prompts, normalised."""
  per_class = normalized(prompt_embeddings).reshape(num_classes, -1, prompt_embeddings.shape[-1])
  return normalized(per_class.mean(axis=1))


def _ranks(scores: np.ndarray, answer_scores: np.ndarray) -> np.ndarray:
  """How many candidates of each row score strictly above its answer: 0 is the top."""
  return (scores > answer_scores[:, None]).sum(axis=1)


def top_k_accuracies(image_embeddings: np.ndarray, classes: np.ndarray, labels: np.ndarray,
                     ks=(1, 5)) -> dict[int, float]:
  """{k: the share of images whose label is among the k classes (C, D unit rows) most similar to
  them}."""
  scores = normalized(image_embeddings) @ classes.T
  ranks = _ranks(scores, scores[np.arange(len(labels)), labels])
  return {k: float(np.mean(ranks < k)) for k in ks}


def retrieval_recalls(image_embeddings: np.ndarray, text_embeddings: np.ndarray,
                      owners: np.ndarray, ks=(1, 5)) -> dict[str, float]:
  """{'i2t_r{k}', 't2i_r{k}'}: recall at k of N images against M texts, text j being a caption of
  image owners[j] (every image has at least one)."""
  scores = normalized(image_embeddings) @ normalized(text_embeddings).T  # (N, M)
  own = owners[None, :] == np.arange(len(scores))[:, None]
  best_own = np.where(own, scores, -np.inf).max(axis=1)
  image_ranks = _ranks(scores, best_own)
  text_scores = scores.T  # (M, N)
  text_ranks = _ranks(text_scores, text_scores[np.arange(len(owners)), owners])
  out = {}
  for k in ks:
    out[f'i2t_r{k}'] = float(np.mean(image_ranks < k))
    out[f't2i_r{k}'] = float(np.mean(text_ranks < k))
  return out
