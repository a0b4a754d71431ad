// Entry point of the Suzumio control room: loads the only stylesheet and mounts <App/> into #app.
import { render } from 'preact';
import './styles.css';
import { App } from './app';

const root = document.getElementById('app');
if (root) render(<App />, root);
