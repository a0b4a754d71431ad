// Entry point of the Suzumio control room: loads the only stylesheet, adopts the API token of the
// Control room URL (`/?token=…`) and mounts <App/> into #app.
import { render } from 'preact';
import './styles.css';
import { adoptUrlToken } from './api';
import { App } from './app';

adoptUrlToken();

const root = document.getElementById('app');
if (root) render(<App />, root);
