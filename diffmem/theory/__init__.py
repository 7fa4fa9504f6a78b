"""The random-features model of the score (Bonnaire et al. 2025, Sec. 3 and appendix C), solved exactly.

constants.py (Gaussian-equivalence constants a_t, b_t, v_t, s_t) -> features.py (one draw of W and data: U's
eigen-decomposition and the losses as quadratic functions of the weights) -> dynamics.py (closed-form gradient
descent; a step-by-step simulation to check it) -> spectrum.py (the predicted supports of U's spectrum) ->
curve_timescales.py (tau_gen, tau_mem of the curves) -> psi_sweep.py (``diffmem theory sweep`` over psi_n) -> figures.py.
"""
